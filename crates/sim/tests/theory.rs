//! Theory checks at a size CI can afford (debug build): measured values within 2 % of the
//! formulas, or within the confidence interval the test computes. `--ignored` runs the
//! larger ones.

use bazaar_sim::theory::*;

/// Fraction of n bins with load ≥ i, pooled over seeds, against the fluid limit.
fn check_tail(measured: f64, fluid: f64, n_total: f64, what: &str) {
    let sigma = (fluid * (1.0 - fluid) / n_total).sqrt();
    let err = (measured - fluid).abs();
    assert!(
        err <= 0.02 * fluid || err <= 4.0 * sigma + 1.0 / n_total.sqrt() * 0.0,
        "{what}: measured {measured:.5}, fluid limit {fluid:.5} (σ {sigma:.5})"
    );
}

#[test]
fn balls_into_bins_with_d_choices_through_the_market() {
    let n = 10_000;
    let seeds = 3;
    let mut maxes = Vec::new();
    for d in [1u32, 2, 3] {
        let (tail, mean_max, _, _) = balls_pooled(n, n, d, seeds, 11);
        let fluid = balls_fluid(d, 1.0, 20);
        let total = (n as u64 * seeds) as f64;
        for i in 1..=2 {
            let err = (tail[i] - fluid[i]).abs() / fluid[i];
            assert!(err < 0.02, "d={d} s{i}: {:.4} vs {:.4}", tail[i], fluid[i]);
        }
        check_tail(
            tail.get(3).copied().unwrap_or(0.0),
            fluid[3],
            total,
            &format!("d={d} s3"),
        );
        maxes.push(mean_max);
    }
    let lnn = (n as f64).ln();
    // One choice: Gonnet's Γ⁻¹(n) − 3/2 = 6.84 at n = 10⁴ (the max is 6, 7 or 8).
    assert!(
        (maxes[0] - gonnet_max_load(n)).abs() <= 1.2,
        "d=1 max {}",
        maxes[0]
    );
    // Two choices: ln ln n / ln 2 + O(1) = 3.20 + O(1); measured 3 or 4.
    let two = lnn.ln() / 2f64.ln();
    assert!(
        maxes[1] >= two - 0.5 && maxes[1] <= two + 1.0,
        "d=2 max {}",
        maxes[1]
    );
    assert!(
        maxes[0] - maxes[1] >= 2.5,
        "two choices cut the max load: {maxes:?}"
    );
    assert!(maxes[2] <= maxes[1]);
}

#[test]
fn supermarket_model_mean_time_at_lambda_08() {
    // Join the shorter of 2, chosen by the market code: T₂(0.8) = 1.9474.
    let r = supermarket(SupermarketConfig {
        n: 400,
        lambda: 0.8,
        chooser: Chooser::Market(2),
        jobs: 300_000,
        warmup: 0.2,
        seed: 3,
    });
    let t = supermarket_mean_time(0.8, 2);
    assert!((t - 1.9474).abs() < 1e-4);
    let err = (r.mean_time - t).abs();
    assert!(
        err / t < 0.02,
        "T measured {:.4} ± {:.4}, formula {t:.4}",
        r.mean_time,
        r.ci95
    );
    assert!(
        err <= r.ci95 + 0.01 * t,
        "outside the CI: {:.4} ± {:.4} vs {t:.4}",
        r.mean_time,
        r.ci95
    );
    for i in 1..=3 {
        let f = supermarket_tail(0.8, 2, i);
        assert!(
            (r.tail[i as usize] - f).abs() / f < 0.03,
            "s{i}: {} vs {f}",
            r.tail[i as usize]
        );
    }
    // One random choice is the M/M/1 queue: T₁ = 1/(1−λ) = 5, far worse.
    let one = supermarket(SupermarketConfig {
        n: 400,
        lambda: 0.8,
        chooser: Chooser::Random,
        jobs: 200_000,
        warmup: 0.2,
        seed: 3,
    });
    assert!(
        (one.mean_time - 5.0).abs() <= one.ci95 + 0.1,
        "T₁ {} ± {}",
        one.mean_time,
        one.ci95
    );
}

#[test]
fn join_idle_queue_beats_two_choices_with_fewer_messages() {
    let cfg = |chooser| SupermarketConfig {
        n: 300,
        lambda: 0.9,
        chooser,
        jobs: 150_000,
        warmup: 0.2,
        seed: 5,
    };
    let jiq = supermarket(cfg(Chooser::Jiq(4)));
    let two = supermarket(cfg(Chooser::ShortestOf(2)));
    assert!(
        jiq.mean_time < two.mean_time,
        "{} vs {}",
        jiq.mean_time,
        two.mean_time
    );
    assert!(jiq.messages_per_job < two.messages_per_job);
}

#[test]
#[ignore = "large: run with --release -- --ignored"]
fn supermarket_model_large() {
    for (lambda, d) in [(0.8, 2), (0.9, 2), (0.8, 3), (0.95, 2)] {
        let r = supermarket(SupermarketConfig {
            n: 2000,
            lambda,
            chooser: Chooser::Market(d),
            jobs: 4_000_000,
            warmup: 0.2,
            seed: 1,
        });
        let t = supermarket_mean_time(lambda, d);
        println!(
            "λ={lambda} d={d}: {:.4} ± {:.4} vs {t:.4}",
            r.mean_time, r.ci95
        );
        assert!((r.mean_time - t).abs() / t < 0.01 || (r.mean_time - t).abs() <= r.ci95);
    }
}

#[test]
#[ignore = "large: run with --release -- --ignored"]
fn balls_into_bins_large() {
    for n in [100_000usize, 1_000_000] {
        let (tail, mean_max, _, _) = balls_pooled(n, n, 2, 1, 1);
        let fluid = balls_fluid(2, 1.0, 10);
        println!(
            "n={n}: max {mean_max}, s1 {:.4}/{:.4} s2 {:.4}/{:.4}",
            tail[1], fluid[1], tail[2], fluid[2]
        );
        for i in 1..=2 {
            assert!((tail[i] - fluid[i]).abs() / fluid[i] < 0.005);
        }
        assert!(mean_max <= ((n as f64).ln().ln() / 2f64.ln()).ceil() + 1.0);
    }
}
