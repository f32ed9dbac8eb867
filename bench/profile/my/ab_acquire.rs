// Scratch A/B of dblock's MariaDB acquisition statement, part by part (issue 45, section 1's
// MariaDB gap). Not compiled with the crate: copy to examples/ and run
// `cargo build --release --example ab_acquire --features mysql && target/release/examples/ab_acquire 8 13`
// (tasks, rounds) after `dblock --database-url mysql://root@127.0.0.1:3306/test --table ab_lock migrate`.
//! Scratch A/B (not committed): which part of dblock's MariaDB acquisition costs.
use std::time::{Duration, Instant};
use sqlx::mysql::MySqlPoolOptions;

const ACQ: &str = "INSERT INTO ab_lock (lock_key, lock_value, expire_time, acquired_at)
VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND, NOW(6))
ON DUPLICATE KEY UPDATE
    lock_value  = IF(expire_time <= NOW(6), VALUES(lock_value), lock_value),
    fencing_token = IF(lock_value = VALUES(lock_value), VALUES(fencing_token), fencing_token),
    acquired_at = IF(lock_value = VALUES(lock_value), VALUES(acquired_at), acquired_at),
    expire_time = IF(lock_value = VALUES(lock_value), VALUES(expire_time), expire_time)";
const RET: &str = "\nRETURNING lock_value, fencing_token, expire_time,
          CAST(@dblock_taken_from IS NOT NULL AS SIGNED)";
const REL: &str = "DELETE FROM ab_lock
 WHERE lock_key = ? AND lock_value = ? AND fencing_token = ? AND expire_time > NOW(6)";

fn named(kind: &str) -> String {
    format!("CONCAT('dblock:', MD5(CONCAT_WS(0x1F, CAST(DATABASE() AS BINARY), 'ab_lock', ?)), ':{kind}')")
}

fn noting(acq: &str) -> String {
    acq.replacen("NOW(6))\nON DUPLICATE", "IF((@dblock_taken_from := NULL) IS NULL, NOW(6), NOW(6)))\nON DUPLICATE", 1)
        .replacen("IF(expire_time <= NOW(6),", "IF(expire_time <= NOW(6) AND (@dblock_taken_from := lock_value) IS NOT NULL,", 1)
}

fn cpu() -> Duration {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
    let t: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    Duration::from_millis(t * 10)
}

#[tokio::main]
async fn main() {
    let pool = MySqlPoolOptions::new().max_connections(8).test_before_acquire(false)
        .connect("mysql://root@127.0.0.1:3306/test").await.unwrap();
    let watchers = format!(",\n CAST(IS_USED_LOCK({}) AS SIGNED), CAST(IS_USED_LOCK({}) AS SIGNED)", named("w0"), named("w1"));
    // (name, text, watcher binds)
    let variants: Vec<(&str, String, bool)> = vec![
        ("hand", format!("{ACQ}{RET}"), false),
        ("full", format!("SET STATEMENT max_statement_time=5 FOR {}{RET}{watchers}", noting(ACQ)), true),
        ("-watch", format!("SET STATEMENT max_statement_time=5 FOR {}{RET}", noting(ACQ)), false),
        ("names", format!("SET STATEMENT max_statement_time=5 FOR {}{RET},\n CAST(IS_USED_LOCK(?) AS SIGNED), CAST(IS_USED_LOCK(?) AS SIGNED)", noting(ACQ)), true),
        ("names-set", format!("{}{RET},\n CAST(IS_USED_LOCK(?) AS SIGNED), CAST(IS_USED_LOCK(?) AS SIGNED)", noting(ACQ)), true),
        ("names1", format!("SET STATEMENT max_statement_time=5 FOR {}{RET},\n (IFNULL(IS_USED_LOCK(?), 0) << 32) | IFNULL(IS_USED_LOCK(?), 0)", noting(ACQ)), true),
    ];
    let tasks: usize = std::env::args().nth(1).map_or(1, |a| a.parse().unwrap());
    let rounds: usize = std::env::args().nth(2).map_or(7, |a| a.parse().unwrap());
    let mut rates = vec![Vec::new(); variants.len()];
    let mut cpus = vec![Vec::new(); variants.len()];
    let mut n = 0u64;
    for round in 0..rounds {
        for j in 0..variants.len() {
            let i = (j + round) % variants.len();
            let (_, text, watch) = &variants[i];
            let stop = Instant::now() + Duration::from_millis(1500);
            let c0 = cpu();
            let mut handles = Vec::new();
            for t in 0..tasks {
                let pool = pool.clone();
                let text = text.clone();
                let watch = *watch;
                n += 1;
                let base = n * 1_000_000_000 + (t as u64) * 10_000_000;
                handles.push(tokio::spawn(async move {
                    let mut k = 0u64;
                    while Instant::now() < stop {
                        k += 1;
                        let key = format!("ab:{}", base + k);
                        let mut q = sqlx::query_as::<_, (String, i64, chrono::DateTime<chrono::Utc>, i64)>(sqlx::AssertSqlSafe(text.clone()))
                            .bind(&key).bind("owner-1").bind(30_000_000i64);
                        if watch {
                            if text.contains("IS_USED_LOCK(?)") {
                                let h = format!("dblock:{:032x}", (base + k) as u128 * 0x9E3779B97F4A7C15u128);
                                q = q.bind(format!("{h}:w0")).bind(format!("{h}:w1"));
                            } else {
                                q = q.bind(&key).bind(&key);
                            }
                        }
                        let rows = q.fetch_all(&pool).await.unwrap();
                        let token = rows[0].1;
                        sqlx::query(REL).bind(&key).bind("owner-1").bind(token).execute(&pool).await.unwrap();
                    }
                    k
                }));
            }
            let mut total = 0;
            for h in handles { total += h.await.unwrap(); }
            let c = cpu() - c0;
            rates[i].push(total as f64 / 1.5);
            cpus[i].push(c.as_micros() as f64 / total as f64);
        }
    }
    let med = |v: &Vec<f64>| { let mut v = v.clone(); v.sort_by(|a, b| a.partial_cmp(b).unwrap()); v[v.len() / 2] };
    for (i, (name, _, _)) in variants.iter().enumerate() {
        let ratios: Vec<f64> = rates[i].iter().zip(&rates[0]).map(|(a, b)| a / b).collect();
        println!("{tasks} tasks {name:8} {:7.0}/s  vs hand {:.3}  client cpu {:.0} us/cycle", med(&rates[i]), med(&ratios), med(&cpus[i]));
    }
}
