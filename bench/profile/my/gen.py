#!/usr/bin/env python3
"""Generates per-client statement files for the MariaDB driver (run.sh).
Each file: NCYC cycles, each one acquire + one release of a fresh random key
('prof:<client>:<random>'), owner a fixed 36-char value, lease 30 s.
Literal values (text protocol, the mariadb CLI), not prepared statements."""
import random, os
NCYC = 5000
OWNER = '6f1c2e0a-3b7d-4c55-9a1e-2f8b7d0c4e91'
LEASE = 30000000
def acquire(t, k, returning):
    s = (f"INSERT INTO {t} (lock_key, lock_value, expire_time, acquired_at)\n"
         f"VALUES ('{k}', '{OWNER}', NOW(6) + INTERVAL {LEASE} MICROSECOND, NOW(6))\n"
         "ON DUPLICATE KEY UPDATE\n"
         "    lock_value  = IF(expire_time <= NOW(6), VALUES(lock_value), lock_value),\n"
         "    fencing_token = IF(lock_value = VALUES(lock_value), VALUES(fencing_token), fencing_token),\n"
         "    acquired_at = IF(lock_value = VALUES(lock_value), VALUES(acquired_at), acquired_at),\n"
         "    expire_time = IF(lock_value = VALUES(lock_value), VALUES(expire_time), expire_time)")
    if returning:
        s += "\nRETURNING lock_value, fencing_token, expire_time"
    return s + ";\n"
def release_live(t, k):
    # RELEASE_LIVE; the token is not known to the CLI client: 'fencing_token >= 0' stands
    # for 'fencing_token = ?' (same PK lookup, one more column compared on the found row)
    return (f"DELETE FROM {t}\n WHERE lock_key = '{k}' AND lock_value = '{OWNER}' "
            f"AND fencing_token >= 0 AND expire_time > NOW(6);\n")
def seeds(t, k):
    return (f"INSERT INTO {t} (lock_key, lock_value, expire_time) VALUES ('{k}', '{OWNER}', NOW() + INTERVAL 30 SECOND);\n"
            f"DELETE FROM {t} WHERE lock_key = '{k}' AND lock_value = '{OWNER}';\n")
VARIANTS = {
    'a_floor':         lambda k: "SELECT 1;\nSELECT 1;\n",
    'b_seeds':         lambda k: seeds('prof_seed', k),
    'b2_seeds_trig':   lambda k: seeds('prof_lock', k),
    'b3_seeds_notrig': lambda k: seeds('prof_lock_nt', k),
    'c_dblock':        lambda k: acquire('prof_lock', k, True) + release_live('prof_lock', k),
    'e_noreturning':   lambda k: acquire('prof_lock', k, False) + release_live('prof_lock', k),
    'f_notrig':        lambda k: acquire('prof_lock_nt', k, True) + release_live('prof_lock_nt', k),
}
os.makedirs('stmts', exist_ok=True)
for name, fn in VARIANTS.items():
    for c in range(8):
        rnd = random.Random(f"{name}-{c}")
        with open(f'stmts/{name}.{c}.sql', 'w') as f:
            for i in range(NCYC):
                f.write(fn(f"prof:{c}:{rnd.randrange(1, 10**9)}"))
