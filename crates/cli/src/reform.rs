//! A smaller world formed from the survivors of a serving world whose lost
//! rank stays gone (`serve --replan-after`). Rank 0 and the supervisor that
//! started the ranks (`launch`) both derive it, with [`shrunk_env`], from the
//! same world variables and the same list of survivors: rank 0 joins the new
//! world with its variables, the supervisor restarts every other survivor with
//! its own. Ranks are numbered anew in the order of their old numbers.

use comm::bootstrap::{format_links, parse_links, ENV_LINKS, ENV_PEERS, ENV_RANK, ENV_SHM, ENV_SIZE};

/// The ranks of the original world that the current one is made of, in
/// order (`0,1,3`); unset: the original world. `--weights` and
/// `SHARDLM_WEIGHTS` name the original ranks, and are picked by it.
pub const ENV_SURVIVORS: &str = "SHARDLM_SURVIVORS";

/// One variable to set (`Some`) or remove (`None`).
pub type EnvChange = (String, Option<String>);

/// The world variables of every rank of the world formed by `keep` (ranks of
/// the current world, rank 0 first, ascending), from the current world's
/// variables as `get` reads them: the new rank and size, the kept peers'
/// addresses and cables (TCP, same ports), a segment of its own (shared
/// memory), and the survivors in the original world's numbering.
pub fn shrunk_env(get: &dyn Fn(&str) -> Option<String>, keep: &[usize]) -> Result<Vec<Vec<EnvChange>>, String> {
    let size: usize = get(ENV_SIZE).and_then(|s| s.trim().parse().ok()).ok_or("the world's size is not known")?;
    if keep.first() != Some(&0) || keep.windows(2).any(|w| w[0] >= w[1]) || keep.iter().any(|&r| r >= size) {
        return Err(format!("survivors {keep:?} are not ranks of a world of {size} in order, rank 0 first"));
    }
    let original: Vec<usize> = match get(ENV_SURVIVORS) {
        Some(s) => {
            parse_ranks(&s).filter(|v| v.len() == size).ok_or(format!("{ENV_SURVIVORS}={s:?} is not {size} ranks"))?
        }
        None => (0..size).collect(),
    };
    let n = keep.len();
    let mut common: Vec<EnvChange> = vec![
        (ENV_SIZE.into(), Some(n.to_string())),
        (ENV_SURVIVORS.into(), Some(keep.iter().map(|&r| original[r].to_string()).collect::<Vec<_>>().join(","))),
    ];
    match get(ENV_SHM).filter(|s| !s.is_empty()) {
        // A segment of its own: ranks still running in the old world never open it.
        Some(name) => common.push((ENV_SHM.into(), Some(format!("{name}-w{n}")))),
        None => {
            let peers: Vec<String> = get(ENV_PEERS)
                .ok_or("the world's peers are not known")?
                .split(',')
                .map(|p| p.trim().to_string())
                .collect();
            if peers.len() != size {
                return Err(format!("{ENV_PEERS} lists {} addresses for {size} ranks", peers.len()));
            }
            common.push((ENV_PEERS.into(), Some(keep.iter().map(|&r| peers[r].clone()).collect::<Vec<_>>().join(","))));
            if let Some(v) = get(ENV_LINKS).filter(|v| !v.trim().is_empty()) {
                let links = parse_links(&v, size).map_err(|e| e.to_string())?;
                let kept: Vec<Vec<String>> = keep.iter().map(|&r| links[r].clone()).collect();
                common.push((ENV_LINKS.into(), Some(format_links(&kept))));
            }
        }
    }
    Ok((0..n)
        .map(|k| {
            let mut env = vec![(ENV_RANK.to_string(), Some(k.to_string()))];
            env.extend(common.iter().cloned());
            env
        })
        .collect())
}

fn parse_ranks(s: &str) -> Option<Vec<usize>> {
    s.split(',').map(|r| r.trim().parse().ok()).collect()
}

/// `weights` (one per rank of the original world, or of the current one)
/// for the current world of `n` ranks: picked by [`ENV_SURVIVORS`] when the
/// world was re-formed from a larger one.
pub fn survivor_weights(weights: Vec<f64>, n: usize, survivors: Option<&str>) -> Vec<f64> {
    match survivors.and_then(parse_ranks) {
        Some(s) if weights.len() != n && s.len() == n && s.iter().all(|&r| r < weights.len()) => {
            s.iter().map(|&r| weights[r]).collect()
        }
        _ => weights,
    }
}

/// The rank a failed join or operation blames: the last `peer N` its message
/// names (`peer 1 … aborted: peer 2 … is gone` blames rank 2).
pub fn blamed_rank(msg: &str) -> Option<usize> {
    let at = msg.rfind("peer ")?;
    let digits: String = msg[at + 5..].chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn getter(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    fn get(env: &[EnvChange], k: &str) -> Option<String> {
        env.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.clone())
    }

    #[test]
    fn tcp_survivors_keep_their_addresses_and_cables() {
        let g = getter(&[(ENV_SIZE, "3"), (ENV_PEERS, "a:1,b:2,c:3"), (ENV_LINKS, "x1;y1,y2;z1")]);
        let envs = shrunk_env(&g, &[0, 2]).unwrap();
        assert_eq!(envs.len(), 2);
        assert_eq!(get(&envs[1], ENV_RANK).as_deref(), Some("1"));
        assert_eq!(get(&envs[1], ENV_SIZE).as_deref(), Some("2"));
        assert_eq!(get(&envs[0], ENV_PEERS).as_deref(), Some("a:1,c:3"));
        assert_eq!(get(&envs[0], ENV_LINKS).as_deref(), Some("x1;z1"));
        assert_eq!(get(&envs[1], ENV_SURVIVORS).as_deref(), Some("0,2"));
    }

    #[test]
    fn shm_survivors_get_a_new_segment_and_compose_their_original_numbers() {
        let g = getter(&[(ENV_SIZE, "3"), (ENV_SHM, "seg"), (ENV_SURVIVORS, "0,2,3")]);
        let envs = shrunk_env(&g, &[0, 2]).unwrap();
        assert_eq!(get(&envs[0], ENV_SHM).as_deref(), Some("seg-w2"));
        assert_eq!(get(&envs[0], ENV_SURVIVORS).as_deref(), Some("0,3"));
        assert!(shrunk_env(&g, &[1, 2]).is_err());
        assert!(shrunk_env(&g, &[0, 3]).is_err());
    }

    #[test]
    fn weights_are_picked_by_the_survivors() {
        assert_eq!(survivor_weights(vec![1.0, 2.0, 3.0], 2, Some("0,2")), vec![1.0, 3.0]);
        assert_eq!(survivor_weights(vec![1.0, 2.0], 2, Some("0,2")), vec![1.0, 2.0]);
        assert_eq!(survivor_weights(vec![1.0, 2.0, 3.0], 3, None), vec![1.0, 2.0, 3.0]);
    }

    #[test]
    fn the_last_named_peer_is_blamed() {
        assert_eq!(blamed_rank("peer 1 at shm:x aborted: peer 2 at shm:x is gone: exited"), Some(2));
        assert_eq!(blamed_rank("could not connect to peer 2 at shm:x within 0.0s: it never joined"), Some(2));
        assert_eq!(blamed_rank("no peer named"), None);
    }
}
