#!/usr/bin/env python3
"""Summarize results/runs.txt: median (min-max) tps per (system, variant, clients),
us per cycle, and ratios (ratio of medians, plus median and range of per-pass ratios)."""
import statistics as st, collections, sys
runs = collections.defaultdict(dict)   # (sys, var, c) -> {pass: tps}
for line in open(sys.argv[1] if len(sys.argv) > 1 else 'results/runs.txt'):
    f = line.split()
    if len(f) < 5 or f[0] == 'ALLDONE': continue
    try: runs[(f[1], f[2], int(f[3]))][int(f[0])] = float(f[4])
    except ValueError: pass
def med(k): return st.median(runs[k].values())
print('| system | variant | clients | passes | median cycles/s | range | us/cycle (1e6/tps) | per-client latency us |')
print('|---|---|---|---|---|---|---|---|')
for k in runs:
    v = sorted(runs[k].values())
    print(f'| {k[0]} | {k[1]} | {k[2]} | {len(v)} | {med(k):,.0f} | {v[0]:,.0f}-{v[-1]:,.0f} | {1e6/med(k):,.1f} | {k[2]*1e6/med(k):,.0f} |')
def ratio(name, a, b):
    for c in (1, 8):
        ka, kb = a + (c,), b + (c,)
        if ka not in runs or kb not in runs: continue
        per = [runs[ka][p] / runs[kb][p] for p in runs[ka] if p in runs[kb]]
        print(f'| {name} | {c} | {med(ka)/med(kb):.2f}x | {st.median(per):.2f}x ({min(per):.2f}-{max(per):.2f}) |')
print()
print('| ratio | clients | ratio of medians | per-pass median (range) |')
print('|---|---|---|---|')
R = [
 ('PG durable: dblock c / seeds b', ('pg','c_dblock_dur'), ('pg','b_seeds_dur')),
 ('PG unlogged: dblock c / seeds b (unlogged)', ('pg','c_dblock_unl'), ('pg','b_seeds_unl')),
 ('PG unlogged c / durable c (target >= 3x)', ('pg','c_dblock_unl'), ('pg','c_dblock_dur')),
 ('PG unlogged c / Redis (target >= 0.3x)', ('pg','c_dblock_unl'), ('redis','py_set_evalsha')),
 ('PG floor a / durable c', ('pg','a_floor'), ('pg','c_dblock_dur')),
 ('PG floor a / unlogged c', ('pg','a_floor'), ('pg','c_dblock_unl')),
 ('PG floor a / Redis', ('pg','a_floor'), ('redis','py_set_evalsha')),
 ('PG floor a / durable seeds b', ('pg','a_floor'), ('pg','b_seeds_dur')),
 ('PG durable: g seeds stmts on dblock table / b', ('pg','g_seedsondblock_dur'), ('pg','b_seeds_dur')),
 ('PG durable: f upsert no RETURNING / g', ('pg','f_noreturning_dur'), ('pg','g_seedsondblock_dur')),
 ('PG durable: e (+RETURNING) / f', ('pg','e_nonextval_dur'), ('pg','f_noreturning_dur')),
 ('PG durable: d (+nextval) / e', ('pg','d_noadvisory_dur'), ('pg','e_nonextval_dur')),
 ('PG durable: c (+advisory lock) / d', ('pg','c_dblock_dur'), ('pg','d_noadvisory_dur')),
 ('PG durable: e / b', ('pg','e_nonextval_dur'), ('pg','b_seeds_dur')),
 ('PG durable: d / b', ('pg','d_noadvisory_dur'), ('pg','b_seeds_dur')),
 ('PG unlogged: g / b', ('pg','g_seedsondblock_unl'), ('pg','b_seeds_unl')),
 ('PG unlogged: f / g', ('pg','f_noreturning_unl'), ('pg','g_seedsondblock_unl')),
 ('PG unlogged: e (+RETURNING) / f', ('pg','e_nonextval_unl'), ('pg','f_noreturning_unl')),
 ('PG unlogged: d (+nextval) / e', ('pg','d_noadvisory_unl'), ('pg','e_nonextval_unl')),
 ('PG unlogged: c (+advisory lock, epoch) / d', ('pg','c_dblock_unl'), ('pg','d_noadvisory_unl')),
 ('PG unlogged d / durable d', ('pg','d_noadvisory_unl'), ('pg','d_noadvisory_dur')),
 ('PG unlogged e / durable e', ('pg','e_nonextval_unl'), ('pg','e_nonextval_dur')),
 ('PG unlogged b / durable b', ('pg','b_seeds_unl'), ('pg','b_seeds_dur')),
 ('MariaDB: dblock c / seeds b (own table)', ('my','c_dblock'), ('my','b_seeds')),
 ('MariaDB: seeds on dblock table (trigger) b2 / b', ('my','b2_seeds_trig'), ('my','b_seeds')),
 ('MariaDB: seeds on no-trigger copy b3 / b', ('my','b3_seeds_notrig'), ('my','b_seeds')),
 ('MariaDB: b2 (trigger) / b3 (no trigger)', ('my','b2_seeds_trig'), ('my','b3_seeds_notrig')),
 ('MariaDB: c / e (RETURNING cost)', ('my','c_dblock'), ('my','e_noreturning')),
 ('MariaDB: c / f (trigger cost in dblock stmt)', ('my','c_dblock'), ('my','f_notrig')),
 ('MariaDB: f (upsert+RETURNING, no trigger) / b3', ('my','f_notrig'), ('my','b3_seeds_notrig')),
 ('MariaDB floor a / c', ('my','a_floor'), ('my','c_dblock')),
]
for r in R: ratio(*r)
