use analyzer::sim::{drive, H2Variant, Injection, Sim, SimAlgo, SimConfig};
use analyzer::wire::{class_code, AnomalyClass};
use analyzer::{Engine, EngineConfig};

fn run(algo: SimAlgo, n: u32, class: Option<AnomalyClass>, rank: u32, silent: bool) {
    let start = 200_000_000_000;
    let cfg = SimConfig {
        nranks: n,
        algo,
        duration_ns: 560_000_000_000,
        inject: class.map(|c| Injection { class: c, rank, start_ns: start, silent, h2: H2Variant::TypeMismatch }),
        ..SimConfig::default()
    };
    let sim = Sim::new(cfg).unwrap();
    let mut e = Engine::new(EngineConfig::default());
    let t = std::time::Instant::now();
    let res = drive(sim, &mut e);
    println!("{:?} n={n} class={:?} rank={rank}: acc {} rej {} {:?} in {:?}", algo, class.map(class_code), res.accepted, res.rejected, res.reasons.first(), t.elapsed());
    for d in &res.diagnoses {
        println!("  {} {:?} roots={:?} :: {}", class_code(d.class()), d.id, d.roots.iter().map(|r| r.rank).collect::<Vec<_>>(), d.summary);
    }
}

#[test]
fn smoke() {
    for algo in [SimAlgo::Ring, SimAlgo::Tree] {
        for n in [4, 64] {
            run(algo, n, None, 0, false);
            for c in [AnomalyClass::H1NotEntered, AnomalyClass::H2Inconsistent, AnomalyClass::H3Hardware, AnomalyClass::S1ComputationSlow, AnomalyClass::S2CommunicationSlow, AnomalyClass::S3MixedSlow] {
                for r in [0, n / 2, n - 1] {
                    run(algo, n, Some(c), r, false);
                }
            }
        }
    }
}
