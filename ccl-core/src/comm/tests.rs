use super::*;

fn resolve(cfg: &CommConfig, vars: &[(&str, &str)]) -> Result<Tuning> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Tuning::resolve(cfg, &move |p: &env::Param| {
        Ok(vars
            .iter()
            .find(|(k, _)| *k == p.name)
            .map(|(_, v)| v.clone()))
    })
}

#[test]
fn defaults() {
    let t = resolve(&CommConfig::default(), &[]).unwrap();
    assert_eq!((t.min_channels, t.max_channels), (1, DEFAULT_MAX_CHANNELS));
    assert_eq!(t.buffsize, DEFAULT_BUFFSIZE);
    assert_eq!(t.slot_bytes, DEFAULT_BUFFSIZE / FIFO_SLOTS);
    assert_eq!(t.peer_check, Duration::from_millis(DEFAULT_PEER_CHECK_MS));
}

#[test]
fn channel_bounds_env_over_config_and_clamped() {
    let cfg = CommConfig {
        min_ctas: Some(2),
        max_ctas: Some(6),
        ..CommConfig::default()
    };
    let t = resolve(&cfg, &[]).unwrap();
    assert_eq!((t.min_channels, t.max_channels), (2, 6));
    let t = resolve(
        &cfg,
        &[("NCCL_MAX_NCHANNELS", "3"), ("NCCL_MIN_NCHANNELS", "3")],
    )
    .unwrap();
    assert_eq!((t.min_channels, t.max_channels), (3, 3));
    // The CTAS names win over the deprecated NCHANNELS names.
    let t = resolve(&cfg, &[("NCCL_MAX_CTAS", "8"), ("NCCL_MAX_NCHANNELS", "3")]).unwrap();
    assert_eq!(t.max_channels, 8);
    let t = resolve(&cfg, &[("NCCL_MAX_CTAS", "1000"), ("NCCL_MIN_CTAS", "0")]).unwrap();
    assert_eq!((t.min_channels, t.max_channels), (1, MAX_CHANNELS));
    // min above max is lowered to max.
    let t = resolve(&cfg, &[("NCCL_MIN_CTAS", "9"), ("NCCL_MAX_CTAS", "4")]).unwrap();
    assert_eq!((t.min_channels, t.max_channels), (4, 4));
}

#[test]
fn malformed_or_out_of_range_values_name_the_variable() {
    for (k, v) in [
        ("NCCL_MIN_CTAS", "x"),
        ("NCCL_MAX_NCHANNELS", "-1"),
        ("NCCL_BUFFSIZE", "100"),
        ("NCCL_BUFFSIZE", "2G"),
        ("NCCL_BUFFSIZE", "1.5M"),
        ("CCLD_PEER_CHECK_MS", "0"),
        ("CCLD_PEER_CHECK_MS", "soon"),
    ] {
        let e = resolve(&CommConfig::default(), &[(k, v)]).unwrap_err();
        assert_eq!(e.code(), crate::types::ResultCode::InvalidArgument);
        assert!(e.to_string().contains(k), "{e}");
    }
    let t = resolve(&CommConfig::default(), &[("NCCL_BUFFSIZE", "64K")]).unwrap();
    assert_eq!(t.slot_bytes, 8192);
    let t = resolve(&CommConfig::default(), &[("NCCL_BUFFSIZE", "1000")]).unwrap();
    assert_eq!(t.slot_bytes, 64, "rounded down to whole cache lines");
}

#[test]
fn split_lineage_differs_per_color_and_sequence() {
    let l = |seq: u64, color: i32| mix64(mix64(seq) ^ u64::from(color as u32));
    assert_ne!(l(0, 0), l(0, 1));
    assert_ne!(l(0, 0), l(1, 0));
    assert_eq!(l(3, 7), l(3, 7));
}

#[test]
fn config_inherits_unset_fields_from_the_parent() {
    let parent = CommConfig {
        blocking: Some(false),
        max_ctas: Some(7),
        comm_name: Some("p".into()),
        ..CommConfig::default()
    };
    let child = CommConfig {
        max_ctas: Some(2),
        ..CommConfig::default()
    }
    .or(&parent);
    assert_eq!(child.blocking, Some(false));
    assert_eq!(child.max_ctas, Some(2));
    assert_eq!(child.comm_name.as_deref(), Some("p"));
}
