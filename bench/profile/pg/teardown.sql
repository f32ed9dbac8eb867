DROP TABLE IF EXISTS prof_seed, prof_seed_u, prof_lock, prof_lock_relaxed, prof_lock_relaxed_epoch;
DROP FUNCTION IF EXISTS prof_lock_relaxed_new_epoch();
DROP SEQUENCE IF EXISTS prof_lock_fencing_seq, prof_lock_relaxed_fencing_seq;
