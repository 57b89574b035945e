//! Incidents: the first cause of an anomaly across communicators, with the per-communicator
//! diagnoses as evidence (see `Incident` in `proto/ccld.proto`).
//!
//! Pure; the engine hands every new diagnosis to [`Incidents::add`] and the service takes
//! the new incidents with [`crate::Engine::take_incidents`].

use crate::report;
use crate::wire::{Diagnosis, Incident};

/// Incidents made and not yet taken.
#[derive(Debug, Default)]
pub struct Incidents {
    pending: Vec<Incident>,
}

/// Incident id of a single diagnosis (`inc-<diagnosis id>`).
pub fn incident_id(d: &Diagnosis) -> String {
    format!("inc-{}", d.id)
}

/// An incident whose only evidence is `d`: its roots, chain "root: ..." and summary line.
pub fn from_diagnosis(d: &Diagnosis) -> Incident {
    let mut chain = Vec::new();
    for r in &d.roots {
        let mut s = format!("root: rank {} (pid {}, host {})", r.rank, r.pid, r.host);
        if !r.reason.is_empty() {
            s.push_str(&format!(", {}", r.reason));
        }
        chain.push(s);
    }
    let mut inc = Incident {
        id: incident_id(d),
        class: d.class,
        roots: d.roots.clone(),
        comm_id: d.comm_id,
        trace: d.trace,
        collective: d.collective,
        chain,
        evidence: vec![d.clone()],
        detected_at_ns: d.detected_at_ns,
        onset_ns: d.onset_ns,
        summary: String::new(),
    };
    inc.summary = report::incident_line(&inc);
    inc
}

impl Incidents {
    /// Takes the diagnoses of one tick (already filled with detection times).
    pub fn add(&mut self, diags: &[Diagnosis]) {
        for d in diags {
            self.pending.push(from_diagnosis(d));
        }
    }

    /// Incidents made since the last call.
    pub fn take(&mut self) -> Vec<Incident> {
        std::mem::take(&mut self.pending)
    }
}

/// Puts the service's diagnosis ids and shard names (assigned after the engine made the
/// incidents) into an incident's evidence, matching by communicator, operation and class.
pub fn adopt_ids(inc: &mut Incident, diags: &[Diagnosis]) {
    for ev in &mut inc.evidence {
        let same = diags.iter().find(|d| {
            d.comm_id == ev.comm_id
                && d.class == ev.class
                && d.trace.map(|t| t.op_counter) == ev.trace.map(|t| t.op_counter)
        });
        if let Some(d) = same {
            ev.id.clone_from(&d.id);
            ev.shard.clone_from(&d.shard);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{AnomalyClass, RootCause, TraceId};

    #[test]
    fn one_incident_per_diagnosis_taken_once() {
        let d = Diagnosis {
            id: "c-5-H1".into(),
            class: AnomalyClass::H1NotEntered as i32,
            roots: vec![RootCause {
                rank: 3,
                pid: 9,
                host: "h".into(),
                reason: "not entered".into(),
                ..Default::default()
            }],
            comm_id: 7,
            trace: Some(TraceId {
                comm_id: 7,
                op_counter: 5,
                extension: 0,
            }),
            detected_at_ns: 100,
            onset_ns: 50,
            ..Default::default()
        };
        let mut inc = Incidents::default();
        inc.add(std::slice::from_ref(&d));
        let v = inc.take();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].roots[0].rank, 3);
        assert_eq!(v[0].class, d.class);
        assert_eq!(
            v[0].chain,
            vec!["root: rank 3 (pid 9, host h), not entered"]
        );
        assert!(v[0].summary.contains("root rank 3 (pid 9, host h)"));
        assert!(inc.take().is_empty());
        let mut i = v[0].clone();
        let mut served = d.clone();
        served.id = "s0-1".into();
        served.shard = "a:1".into();
        adopt_ids(&mut i, &[served]);
        assert_eq!(i.evidence[0].id, "s0-1");
        assert_eq!(i.evidence[0].shard, "a:1");
    }
}
