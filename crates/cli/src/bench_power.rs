//! `bench`'s power report (per rank, per phase: mean and peak watts, joules
//! per token, from `engine::power`) and its `--plot FILE.svg`: tok/s over
//! context depth and the per-phase power, as a hand-written SVG.

use engine::dist::RankReport;
use engine::power::PhaseEnergy;
use serde_json::{json, Value};
use std::fmt::Write;

/// One rank's power, or why it has none.
#[derive(Debug, Clone)]
pub struct RankPower {
    pub rank: usize,
    pub host: String,
    /// Prefill and decode, or the reason power is not readable there.
    pub phases: Result<[PhaseEnergy; 2], String>,
    pub sources: Vec<String>,
}

/// Rank 0's phases from this process's meter (measured since the warm-up
/// ended), the others' from their shutdown reports (measured since they
/// loaded: the warm-up is in them, which the per-token and mean figures
/// absorb); reasons from the startup reports.
pub fn collect(reports: &[RankReport]) -> Vec<RankPower> {
    let infos = engine::rank_info::gathered();
    let host =
        |r: usize| infos.as_ref().and_then(|i| i.get(r)).map_or_else(engine::rank_info::hostname, |i| i.host.clone());
    let reason = |r: usize| {
        infos
            .as_ref()
            .and_then(|i| i.get(r))
            .and_then(|i| i.power.clone().err())
            .unwrap_or_else(|| "no reading came back from that rank".into())
    };
    reports
        .iter()
        .enumerate()
        .map(|(r, rep)| {
            let (phases, sources) = if r == 0 {
                match engine::power::global() {
                    Ok(m) => (Ok(m.phases()), m.sources.clone()),
                    Err(e) => (Err(e.to_string()), Vec::new()),
                }
            } else {
                let src = infos.as_ref().and_then(|i| i.get(r)).and_then(|i| i.power.clone().ok()).unwrap_or_default();
                (rep.power.ok_or_else(|| reason(r)), src)
            };
            RankPower { rank: r, host: host(r), phases, sources }
        })
        .collect()
}

fn phase_json(p: &PhaseEnergy) -> Value {
    json!({
        "mean_w": p.mean_w(), "peak_w": (p.seconds > 0.0).then_some(p.peak_w),
        "joules": p.joules, "seconds": p.seconds, "tokens": p.tokens,
        "joules_per_token": p.joules_per_token(),
    })
}

pub fn to_json(all: &[RankPower]) -> Value {
    Value::Array(
        all.iter()
            .map(|p| match &p.phases {
                Ok([pre, dec]) => json!({
                    "rank": p.rank, "host": p.host, "readable": true, "sources": p.sources,
                    "prefill": phase_json(pre), "decode": phase_json(dec),
                }),
                Err(reason) => json!({"rank": p.rank, "host": p.host, "readable": false, "reason": reason}),
            })
            .collect(),
    )
}

fn phase_text(name: &str, p: &PhaseEnergy) -> String {
    match (p.mean_w(), p.joules_per_token()) {
        (Some(w), Some(j)) => format!("{name} mean {w:.1} W, peak {:.1} W, {j:.4} J/token", p.peak_w),
        (Some(w), None) => format!("{name} mean {w:.1} W, peak {:.1} W", p.peak_w),
        _ => format!("{name} too short to sample"),
    }
}

/// One line per rank: "power rank 0 (host): prefill …; decode …" or
/// "power: not readable here (reason)".
pub fn lines(all: &[RankPower]) -> Vec<String> {
    all.iter()
        .map(|p| {
            let who = if all.len() > 1 { format!(" rank {} ({})", p.rank, p.host) } else { String::new() };
            match &p.phases {
                Ok([pre, dec]) => format!(
                    "Power{who} [{}]: {}; {}",
                    p.sources.join(", "),
                    phase_text("prefill", pre),
                    phase_text("decode", dec)
                ),
                Err(reason) if all.len() == 1 => format!("power: not readable here ({reason})"),
                Err(reason) => format!("power{who}: not readable there ({reason})"),
            }
        })
        .collect()
}

/// Throughput at a context depth: (depth in tokens, tok/s).
pub type Curve = Vec<(f64, f64)>;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A "nice" upper bound for an axis (1, 2 or 5 × 10^k above `x`).
fn nice_max(x: f64) -> f64 {
    if x <= 0.0 || !x.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * p).find(|&v| v >= x).unwrap_or(10.0 * p)
}

/// The SVG: left, tok/s over context depth (prefill and decode curves);
/// right, mean and peak watts per rank and phase, or why there are none.
pub fn plot_svg(title: &str, prefill: &Curve, decode: &Curve, power: &[RankPower]) -> String {
    let (w, h) = (960.0, 420.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#, w / 2.0, esc(title));
    // Left panel: throughput.
    let (x0, y0, pw, ph) = (60.0, 50.0, 500.0, 310.0);
    let all: Vec<&(f64, f64)> = prefill.iter().chain(decode.iter()).collect();
    let xmax = nice_max(all.iter().map(|p| p.0).fold(0.0, f64::max));
    let ymax = nice_max(all.iter().map(|p| p.1).fold(0.0, f64::max));
    let sx = |x: f64| x0 + pw * x / xmax;
    let sy = |y: f64| y0 + ph - ph * y / ymax;
    let _ = writeln!(s, r##"<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>"##);
    for k in 0..=5 {
        let (xv, yv) = (xmax * k as f64 / 5.0, ymax * k as f64 / 5.0);
        let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">{xv:.0}</text>"#, sx(xv), y0 + ph + 16.0);
        let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="end">{yv:.0}</text>"#, x0 - 6.0, sy(yv) + 4.0);
        let _ = writeln!(s, r##"<line x1="{x0}" x2="{0}" y1="{1}" y2="{1}" stroke="#eee"/>"##, x0 + pw, sy(yv));
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">context depth (tokens)</text>"#,
        x0 + pw / 2.0,
        y0 + ph + 34.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(16 {}) rotate(-90)" text-anchor="middle">tok/s</text>"#,
        y0 + ph / 2.0
    );
    for (curve, color, name, ly) in [(prefill, "#2f6fde", "prefill", 0.0), (decode, "#d9480f", "decode", 16.0)] {
        if curve.is_empty() {
            continue;
        }
        let pts: Vec<String> = curve.iter().map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y))).collect();
        let _ = writeln!(s, r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#, pts.join(" "));
        for &(x, y) in curve.iter().filter(|_| curve.len() <= 2) {
            let _ = writeln!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{color}"/>"#, sx(x), sy(y));
        }
        let _ = writeln!(s, r#"<text x="{}" y="{}" fill="{color}">{name}</text>"#, x0 + pw - 60.0, y0 + 16.0 + ly);
    }
    // Right panel: power per rank and phase.
    let (px, py, pww) = (620.0, 50.0, 300.0);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="13">power per phase (mean bar, peak tick)</text>"#,
        px + pww / 2.0,
        py
    );
    let wmax = nice_max(
        power
            .iter()
            .filter_map(|p| p.phases.as_ref().ok())
            .flat_map(|ph| ph.iter().map(|e| e.peak_w.max(e.mean_w().unwrap_or(0.0))))
            .fold(0.0, f64::max),
    );
    let mut y = py + 20.0;
    for p in power {
        let _ = writeln!(s, r#"<text x="{px}" y="{y}">rank {} ({})</text>"#, p.rank, esc(&p.host));
        y += 8.0;
        match &p.phases {
            Ok(ph) => {
                for (e, name, color) in [(&ph[0], "prefill", "#2f6fde"), (&ph[1], "decode", "#d9480f")] {
                    let mean = e.mean_w().unwrap_or(0.0);
                    let bw = (pww - 90.0) * mean / wmax;
                    let _ = writeln!(s, r#"<text x="{px}" y="{}">{name}</text>"#, y + 12.0);
                    let _ =
                        writeln!(s, r#"<rect x="{}" y="{y}" width="{bw:.1}" height="14" fill="{color}"/>"#, px + 55.0);
                    let tick = px + 55.0 + (pww - 90.0) * e.peak_w / wmax;
                    let _ = writeln!(
                        s,
                        r#"<line x1="{tick:.1}" x2="{tick:.1}" y1="{}" y2="{}" stroke="black" stroke-width="2"/>"#,
                        y - 2.0,
                        y + 16.0
                    );
                    let _ = writeln!(
                        s,
                        r#"<text x="{:.1}" y="{}">{mean:.1} W / {:.1} W</text>"#,
                        px + 60.0 + bw.max(tick - px - 55.0),
                        y + 12.0,
                        e.peak_w
                    );
                    y += 20.0;
                }
            }
            Err(reason) => {
                let _ = writeln!(
                    s,
                    r##"<text x="{px}" y="{}" fill="#a00">not readable: {}</text>"##,
                    y + 12.0,
                    esc(&wrap(reason, 40)[0])
                );
                for (i, more) in wrap(reason, 40).iter().enumerate().skip(1) {
                    let _ = writeln!(
                        s,
                        r##"<text x="{px}" y="{}" fill="#a00">{}</text>"##,
                        y + 12.0 + 14.0 * i as f64,
                        esc(more)
                    );
                }
                y += 14.0 * wrap(reason, 40).len() as f64 + 6.0;
            }
        }
        y += 10.0;
    }
    s.push_str("</svg>\n");
    s
}

/// Words of `text` in lines of at most `width` characters.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out = vec![String::new()];
    for word in text.split_whitespace() {
        let last = out.last_mut().expect("never empty");
        if !last.is_empty() && last.len() + 1 + word.len() > width {
            out.push(word.to_string());
        } else {
            if !last.is_empty() {
                last.push(' ');
            }
            last.push_str(word);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<RankPower> {
        let e = |j: f64, s: f64, pk: f64, t: u64| PhaseEnergy { joules: j, seconds: s, peak_w: pk, tokens: t };
        vec![
            RankPower {
                rank: 0,
                host: "a".into(),
                phases: Ok([e(10.0, 0.5, 25.0, 512), e(30.0, 2.0, 18.0, 127)]),
                sources: vec!["rapl package-0".into()],
            },
            RankPower {
                rank: 1,
                host: "b".into(),
                phases: Err("permission denied reading intel-rapl:0".into()),
                sources: vec![],
            },
        ]
    }

    #[test]
    fn report_gives_mean_peak_and_joules_per_token_or_the_reason() {
        let l = lines(&sample());
        assert!(l[0].contains("prefill mean 20.0 W, peak 25.0 W, 0.0195 J/token"), "{}", l[0]);
        assert!(l[0].contains("decode mean 15.0 W, peak 18.0 W, 0.2362 J/token"), "{}", l[0]);
        assert!(l[1].contains("not readable there (permission denied"), "{}", l[1]);
        let j = to_json(&sample());
        assert_eq!(j[0]["prefill"]["mean_w"], 20.0);
        assert_eq!(j[1]["readable"], false);
        let single = vec![RankPower { rank: 0, host: "a".into(), phases: Err("no sensor".into()), sources: vec![] }];
        assert_eq!(lines(&single), vec!["power: not readable here (no sensor)"]);
    }

    #[test]
    fn plot_is_an_svg_with_both_curves_and_the_power() {
        let svg =
            plot_svg("t <x>", &vec![(256.0, 900.0), (512.0, 800.0)], &vec![(520.0, 60.0), (600.0, 58.0)], &sample());
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("t &lt;x&gt;") && svg.contains("not readable: permission denied"));
        assert!(svg.contains("20.0 W / 25.0 W"));
    }

    #[test]
    fn axis_bounds_are_round() {
        assert_eq!(nice_max(730.0), 1000.0);
        assert_eq!(nice_max(130.0), 200.0);
        assert_eq!(nice_max(0.0), 1.0);
    }
}
