//! The power part of `GET /cluster`: each rank's reading (rank 0's taken now,
//! the others' from their answer to the latest ping, `engine::power::live`),
//! its prefill and decode energy, and per host the one reading that counts:
//! ranks on one host read the same package or board, so a host's watts are
//! counted once, from its lowest readable rank.

use engine::power::live::{self, PowerSnapshot};
use engine::power::PhaseEnergy;
use engine::rank_info::RankInfo;
use serde_json::{json, Value};

/// A rank's latest reading: its age in seconds and the snapshot, or none yet.
pub type Reading = Option<(f64, PowerSnapshot)>;

/// The readings of `ranks`: rank 0's from this process now, the others' as
/// their last ping answer brought them.
pub fn readings(ranks: &[RankInfo]) -> Vec<Reading> {
    ranks
        .iter()
        .map(|r| {
            if r.rank == 0 {
                Some((0.0, PowerSnapshot::here()))
            } else {
                live::latest(r.rank).map(|(age, s)| (age.as_secs_f64(), s))
            }
        })
        .collect()
}

/// One phase's figures (`null`s where the phase is too short to have them).
pub fn phase_json(p: &PhaseEnergy) -> Value {
    json!({
        "mean_w": p.mean_w(), "peak_w": (p.seconds > 0.0).then_some(p.peak_w),
        "joules": p.joules, "seconds": p.seconds, "tokens": p.tokens,
        "joules_per_token": p.joules_per_token(),
    })
}

fn readable(r: &Reading) -> Option<&(f64, PowerSnapshot)> {
    r.as_ref().filter(|(_, s)| s.reason.is_none())
}

/// Per rank (in `ranks`' order) its `power` object, and the cluster's
/// `power` summary: per host, the total, and per phase.
pub fn power_json(ranks: &[RankInfo], readings: &[Reading]) -> (Vec<Value>, Value) {
    let host_of = |i: usize| readings[i].as_ref().map_or_else(|| ranks[i].host.clone(), |(_, s)| s.host.clone());
    let mut hosts: Vec<String> = Vec::new();
    for i in 0..ranks.len() {
        if !hosts.contains(&host_of(i)) {
            hosts.push(host_of(i));
        }
    }
    // The rank whose reading counts for each host: its first readable one.
    let counter = |h: &str| (0..ranks.len()).find(|&i| host_of(i) == h && readable(&readings[i]).is_some());
    let per_rank = (0..ranks.len())
        .map(|i| {
            let host = host_of(i);
            match (&readings[i], &ranks[i].power) {
                (Some((age, s)), _) if s.reason.is_none() => json!({
                    "readable": true, "host": host, "sources": s.sources,
                    "watts": s.watts, "joules": s.joules, "age_s": age,
                    // Every source measures the host (package, board, its GPUs).
                    "host_wide": true,
                    "counted_for_host": counter(&host) == Some(i),
                    "prefill": phase_json(&s.phases[0]), "decode": phase_json(&s.phases[1]),
                }),
                (Some((_, s)), _) => json!({"readable": false, "host": host, "reason": s.reason}),
                (None, Err(reason)) => json!({"readable": false, "host": host, "reason": reason}),
                // Readable there, but no ping has brought a reading yet.
                (None, Ok(sources)) => json!({
                    "readable": true, "host": host, "sources": sources, "watts": null, "joules": null,
                    "age_s": null, "host_wide": true, "counted_for_host": false, "prefill": null, "decode": null,
                }),
            }
        })
        .collect();
    let host_rows: Vec<Value> = hosts
        .iter()
        .map(|h| {
            let members: Vec<usize> =
                (0..ranks.len()).filter(|&i| host_of(i) == h.as_str()).map(|i| ranks[i].rank).collect();
            match counter(h) {
                Some(i) => json!({
                    "host": h, "ranks": members, "readable": true, "read_by_rank": ranks[i].rank,
                    "watts": readings[i].as_ref().and_then(|(_, s)| s.watts),
                }),
                None => {
                    let first = (0..ranks.len()).find(|&i| host_of(i) == h.as_str()).unwrap_or(0);
                    let reason = match (&readings[first], &ranks[first].power) {
                        (Some((_, s)), _) => s.reason.clone().unwrap_or_default(),
                        (None, Err(r)) => r.clone(),
                        (None, Ok(_)) => "no reading from that host yet".to_string(),
                    };
                    json!({"host": h, "ranks": members, "readable": false, "read_by_rank": null,
                           "watts": null, "reason": reason})
                }
            }
        })
        .collect();
    let counted: Vec<&PowerSnapshot> =
        hosts.iter().filter_map(|h| counter(h)).filter_map(|i| readings[i].as_ref().map(|(_, s)| s)).collect();
    let total_w: Option<f64> =
        (!counted.is_empty()).then(|| counted.iter().map(|s| s.watts).sum::<Option<f64>>()).flatten();
    // Per phase over the hosts: their joules add up; the tokens are the
    // cluster's (every rank of a split runs every token: the most any counted).
    let phase = |k: usize| {
        if counted.is_empty() {
            return Value::Null;
        }
        let joules: f64 = counted.iter().map(|s| s.phases[k].joules).sum();
        let tokens = counted.iter().map(|s| s.phases[k].tokens).max().unwrap_or(0);
        let mean_w: Option<f64> = counted.iter().map(|s| s.phases[k].mean_w()).sum();
        json!({
            "joules": joules, "tokens": tokens, "mean_w": mean_w,
            "joules_per_token": (tokens > 0 && joules > 0.0).then(|| joules / tokens as f64),
        })
    };
    let summary = json!({"hosts": host_rows, "total_watts": total_w, "prefill": phase(0), "decode": phase(1)});
    (per_rank, summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: usize, host: &str, power: Result<Vec<String>, String>) -> RankInfo {
        RankInfo {
            rank,
            host: host.into(),
            pid: 1,
            stage: 0,
            tp_rank: 0,
            layers: [0, 1],
            has_embed: true,
            has_head: true,
            experts: None,
            weight_bytes: 1,
            kv_bytes_per_token: 1,
            window_kv_bytes_per_token: 0,
            rss_bytes: 1,
            mem_total_bytes: 1,
            mem_available_bytes: 1,
            links: Vec::new(),
            power,
        }
    }

    fn snap(host: &str, watts: f64, decode_j: f64, tokens: u64) -> PowerSnapshot {
        let dec = PhaseEnergy { joules: decode_j, seconds: decode_j / watts, peak_w: watts + 1.0, tokens };
        PowerSnapshot {
            host: host.into(),
            sources: vec!["rapl package-0".into()],
            reason: None,
            watts: Some(watts),
            joules: 100.0,
            phases: [PhaseEnergy::default(), dec],
        }
    }

    #[test]
    fn ranks_on_one_host_are_counted_once() {
        let src = Ok(vec!["rapl package-0".to_string()]);
        let ranks = [rank(0, "a", src.clone()), rank(1, "a", src.clone()), rank(2, "b", src)];
        let rd = vec![
            Some((0.0, snap("a", 30.0, 60.0, 10))),
            Some((0.5, snap("a", 31.0, 62.0, 10))),
            Some((0.7, snap("b", 20.0, 40.0, 10))),
        ];
        let (per, sum) = power_json(&ranks, &rd);
        assert_eq!(per[0]["counted_for_host"], true);
        assert_eq!(per[1]["counted_for_host"], false);
        assert_eq!(per[2]["counted_for_host"], true);
        assert_eq!(per[1]["age_s"], 0.5);
        assert_eq!(per[1]["decode"]["joules_per_token"], 6.2);
        assert_eq!(sum["total_watts"], 50.0, "host a once (rank 0's 30 W) plus host b");
        assert_eq!(sum["hosts"][0]["ranks"], json!([0, 1]));
        assert_eq!(sum["hosts"][0]["read_by_rank"], 0);
        assert_eq!(sum["decode"]["joules"], 100.0);
        assert_eq!(sum["decode"]["joules_per_token"], 10.0);
        assert_eq!(sum["decode"]["mean_w"], 50.0);
        assert_eq!(sum["prefill"]["joules_per_token"], Value::Null, "no prefill yet: no invented number");
    }

    #[test]
    fn unreadable_and_not_yet_read_ranks_say_so() {
        let ranks =
            [rank(0, "a", Err("no RAPL or hwmon power sensor under /sys".into())), rank(1, "b", Ok(vec!["x".into()]))];
        let here = PowerSnapshot { host: "a".into(), reason: Some("no sensor here".into()), ..Default::default() };
        let (per, sum) = power_json(&ranks, &[Some((0.0, here)), None]);
        assert_eq!(per[0], json!({"readable": false, "host": "a", "reason": "no sensor here"}));
        assert_eq!(per[1]["readable"], true);
        assert_eq!(per[1]["watts"], Value::Null);
        assert_eq!(sum["total_watts"], Value::Null);
        assert_eq!(sum["hosts"][0]["reason"], "no sensor here");
        assert_eq!(sum["hosts"][1]["reason"], "no reading from that host yet");
        assert_eq!(sum["decode"], Value::Null);
    }
}
