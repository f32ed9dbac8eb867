// Scratch A/B of dblock's MariaDB acquisition statement, part by part (issue 45, section 1's
// MariaDB gap). Not compiled with the crate: a binary of its own (sqlx 0.9 with `mysql`,
// tokio, chrono), run as `ab TASKS ROUNDS LEG_MS [variant,variant..]`, e.g.
// `ab 1 60 400 hand,full,cnames,noset`, after
// `dblock --database-url mysql://root@127.0.0.1:3306/test --table ab_lock migrate`.
// Variants: hand (the bench's hand-written upsert), full (dblock's before a46a5a0: SET
// STATEMENT, takeover note, watchers hashed by the server), packed (the watchers in one
// column), cnames (the wait names computed by the client and bound: dblock's since
// a46a5a0), cpacked, noset (full without SET STATEMENT), alias (full with short column
// aliases). The names' values in cnames are stand-ins of the right length.
use std::time::{Duration, Instant};
use sqlx::Row;
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
#[derive(Clone, Copy, PartialEq)]
enum Binds { None, Keys, Names }

#[tokio::main]
async fn main() {
    let pool = MySqlPoolOptions::new().max_connections(8).test_before_acquire(false)
        .connect("mysql://root@127.0.0.1:3306/test").await.unwrap();
    let two = format!(",\n CAST(IS_USED_LOCK({}) AS SIGNED), CAST(IS_USED_LOCK({}) AS SIGNED)", named("w0"), named("w1"));
    let packed = format!(",\n CONCAT_WS(',', IS_USED_LOCK({}), IS_USED_LOCK({}))", named("w0"), named("w1"));
    let set = "SET STATEMENT max_statement_time=5 FOR ";
    let two_aliased = format!(",\n CAST(IS_USED_LOCK({}) AS SIGNED) AS w0, CAST(IS_USED_LOCK({}) AS SIGNED) AS w1", named("w0"), named("w1"));
    let n = noting(ACQ);
    let variants: Vec<(&str, String, Binds)> = vec![
        ("hand", format!("{ACQ}{RET}"), Binds::None),
        ("full", format!("{set}{n}{RET}{two}"), Binds::Keys),
        ("packed", format!("{set}{n}{RET}{packed}"), Binds::Keys),
        ("cnames", format!("{set}{n}{RET},\n CAST(IS_USED_LOCK(?) AS SIGNED), CAST(IS_USED_LOCK(?) AS SIGNED)"), Binds::Names),
        ("cpacked", format!("{set}{n}{RET},\n CONCAT_WS(',', IS_USED_LOCK(?), IS_USED_LOCK(?))"), Binds::Names),
        ("noset", format!("{n}{RET}{two}"), Binds::Keys),
        ("alias", format!("{set}{n}{RET}{two_aliased}"), Binds::Keys),
    ];
    let tasks: usize = std::env::args().nth(1).map_or(1, |a| a.parse().unwrap());
    let rounds: usize = std::env::args().nth(2).map_or(7, |a| a.parse().unwrap());
    let leg: u64 = std::env::args().nth(3).map_or(1500, |a| a.parse().unwrap());
    let only: Vec<String> = std::env::args().nth(4).map_or(vec![], |a| a.split(',').map(str::to_owned).collect());
    let variants: Vec<_> = variants.into_iter().filter(|v| only.is_empty() || only.iter().any(|o| o == v.0)).collect();
    let mut rates = vec![Vec::new(); variants.len()];
    let mut cpus = vec![Vec::new(); variants.len()];
    let mut n = 0u64;
    for round in 0..rounds {
        for j in 0..variants.len() {
            let i = if round % 2 == 0 { (j + round) % variants.len() } else { variants.len() - 1 - (j + round) % variants.len() };
            let (_, text, binds) = &variants[i];
            let stop = Instant::now() + Duration::from_millis(leg);
            let c0 = cpu();
            let mut handles = Vec::new();
            for t in 0..tasks {
                let pool = pool.clone();
                let text = text.clone();
                let binds = *binds;
                n += 1;
                let base = n * 1_000_000_000 + (t as u64) * 10_000_000;
                handles.push(tokio::spawn(async move {
                    let mut k = 0u64;
                    while Instant::now() < stop {
                        k += 1;
                        let key = format!("ab:{}", base + k);
                        let mut q = sqlx::query(sqlx::AssertSqlSafe(text.clone()))
                            .bind(&key).bind("owner-1").bind(30_000_000i64);
                        match binds {
                            Binds::None => {}
                            Binds::Keys => q = q.bind(&key).bind(&key),
                            Binds::Names => {
                                let h = format!("dblock:{:032x}", (base + k) as u128 * 0x9E3779B97F4A7C15u128);
                                q = q.bind(format!("{h}:w0")).bind(format!("{h}:w1"));
                            }
                        }
                        let rows = q.fetch_all(&pool).await.unwrap();
                        let row = &rows[0];
                        let _owner: String = row.get(0);
                        let token: i64 = row.get(1);
                        let _exp: chrono::DateTime<chrono::Utc> = row.get(2);
                        let _taken: i64 = row.get(3);
                        if row.len() == 5 { let _w: Option<String> = row.get(4); }
                        if row.len() == 6 { let _a: Option<i64> = row.get(4); let _b: Option<i64> = row.get(5); }
                        sqlx::query(REL).bind(&key).bind("owner-1").bind(token).execute(&pool).await.unwrap();
                    }
                    k
                }));
            }
            let mut total = 0;
            for h in handles { total += h.await.unwrap(); }
            let c = cpu() - c0;
            rates[i].push(total as f64 / (leg as f64 / 1000.0));
            cpus[i].push(c.as_micros() as f64 / total as f64);
        }
    }
    let med = |v: &Vec<f64>| { let mut v = v.clone(); v.sort_by(|a, b| a.partial_cmp(b).unwrap()); v[v.len() / 2] };
    for (i, (name, _, _)) in variants.iter().enumerate() {
        let mut ratios: Vec<f64> = rates[i].iter().zip(&rates[0]).map(|(a, b)| a / b).collect();
        ratios.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("{tasks} tasks {name:8} {:7.0}/s  vs hand {:.3} ({:.2}-{:.2})  client cpu {:.0} us/cycle", med(&rates[i]), med(&ratios), ratios[ratios.len()/4], ratios[3*ratios.len()/4], med(&cpus[i]));
    }
}
