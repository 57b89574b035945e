use super::*;
use ccld_wire::Evidence;

#[test]
fn class_names() {
    assert_eq!(class_name(AnomalyClass::H1NotEntered as i32), "H1");
    assert_eq!(class_name(AnomalyClass::S3MixedSlow as i32), "S3");
    assert_eq!(class_name(99), "unspecified");
}

#[test]
fn diag_ids() {
    assert_eq!(format_diag_id(StoredDiagnosis::make_id(2, 17)), "s2-17");
}

#[test]
fn latency_is_measured_from_detectability() {
    let mut d = Diagnosis {
        class: AnomalyClass::H3Hardware as i32,
        onset_ns: 1_000,
        detected_at_ns: 10_000,
        evidence: Some(Evidence {
            hang_threshold_ns: 5_000,
            window_end_ns: 9_000,
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(location_latency_ns(&d), 4_000);
    d.class = AnomalyClass::S1ComputationSlow as i32;
    assert_eq!(location_latency_ns(&d), 1_000);
    d.evidence = None;
    assert_eq!(location_latency_ns(&d), 9_000);
    d.detected_at_ns = 0;
    assert_eq!(location_latency_ns(&d), 0);
}
