DROP TABLE IF EXISTS prof_seed, prof_lock, prof_lock_nt, prof_lock_fencing;
