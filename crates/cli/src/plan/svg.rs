//! The `--plot` chart: predicted decode tok/s and TTFT against the number of
//! machines, one line per strategy, two panels side by side. Written as plain
//! SVG (a few dozen elements) rather than through a plotting crate: the output
//! is deterministic text a test can read, and needs no fonts at build time.

use super::cost::Prediction;
use std::fmt::Write;

const COLORS: [&str; 5] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];

/// One panel: `series` are (label, points (machines, value)).
fn panel(out: &mut String, x0: f64, title: &str, series: &[(String, Vec<(f64, f64)>)], max_n: f64) {
    let (w, h, pad) = (420.0, 300.0, 50.0);
    let ymax = series.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)).fold(0.0f64, f64::max).max(1e-9) * 1.1;
    let sx = |n: f64| x0 + pad + (n - 1.0) / (max_n - 1.0).max(1.0) * (w - 2.0 * pad);
    let sy = |v: f64| h - pad + 20.0 - v / ymax * (h - 2.0 * pad);
    let _ = writeln!(out, r#"<text x="{}" y="20" font-size="14" text-anchor="middle">{title}</text>"#, x0 + w / 2.0);
    let _ = writeln!(
        out,
        r#"<line x1="{a}" y1="{b}" x2="{c}" y2="{b}" stroke="black"/><line x1="{a}" y1="{b}" x2="{a}" y2="{d}" stroke="black"/>"#,
        a = x0 + pad,
        b = h - pad + 20.0,
        c = x0 + w - pad,
        d = pad - 10.0
    );
    for i in 1..=(max_n as usize) {
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">{i}</text>"#,
            sx(i as f64),
            h - pad + 36.0
        );
    }
    for k in 0..=4 {
        let v = ymax * k as f64 / 4.0;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" font-size="10" text-anchor="end">{:.3}</text>"#,
            x0 + pad - 4.0,
            sy(v) + 3.0,
            fmt(v)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">machines</text>"#,
        x0 + w / 2.0,
        h + 10.0
    );
    for (i, (label, pts)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts.iter().map(|&(n, v)| format!("{:.1},{:.1}", sx(n), sy(v))).collect();
        let _ = writeln!(out, r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#, path.join(" "));
        for &(n, v) in pts {
            let _ = writeln!(out, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#, sx(n), sy(v));
        }
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" font-size="11" fill="{c}">{label}</text>"#,
            x0 + w - pad - 70.0,
            pad + 14.0 * i as f64
        );
    }
}

fn fmt(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// The chart for all predictions that fit.
pub fn chart(model: &str, preds: &[Prediction]) -> String {
    let max_n = preds.iter().map(|p| p.ranks).max().unwrap_or(1) as f64;
    let mut labels: Vec<String> = Vec::new();
    for p in preds {
        let l = label(p);
        if !labels.contains(&l) {
            labels.push(l);
        }
    }
    let series = |f: &dyn Fn(&Prediction) -> f64| -> Vec<(String, Vec<(f64, f64)>)> {
        labels
            .iter()
            .map(|l| {
                let pts = preds.iter().filter(|p| p.fits && &label(p) == l).map(|p| (p.ranks as f64, f(p))).collect();
                (l.clone(), pts)
            })
            .filter(|(_, p): &(String, Vec<(f64, f64)>)| !p.is_empty())
            .collect()
    };
    let mut out = String::new();
    let _ =
        writeln!(out, r#"<svg xmlns="http://www.w3.org/2000/svg" width="860" height="330" font-family="sans-serif">"#);
    let _ = writeln!(out, "<title>shardlm plan: {}</title>", model.replace('<', "&lt;"));
    panel(&mut out, 0.0, "predicted decode (tok/s)", &series(&|p| p.decode_tok_s), max_n);
    panel(&mut out, 430.0, "predicted TTFT (s)", &series(&|p| p.ttft_s), max_n);
    out.push_str("</svg>\n");
    out
}

fn label(p: &Prediction) -> String {
    match p.strategy {
        super::cost::Strategy::Hybrid => format!("hybrid tp{}", p.tp),
        s => format!("{s:?}").to_lowercase(),
    }
}
