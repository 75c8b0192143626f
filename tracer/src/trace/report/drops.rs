//! The report's line on why events were dropped (`DropCauses`), e.g.
//! `234 counted only: ring full ... on vCPU 1: 200, vCPU 3: 34; 214 of
//! them with the drain behind; 20 of them while the drain was held ...;
//! rings of 128 records, 8,192 asked: the guest's free low memory holds no
//! more`: the ring full because the drain was behind or held, or the rings
//! capped.

use super::numbers::thousands;
use crate::trace::model::TraceMeta;

/// The causes of the trace's dropped events, or None when no cause was
/// counted (and no ring was sized down).
pub fn drops_line(m: &TraceMeta) -> Option<String> {
    let d = &m.drops;
    if d.is_empty() {
        return None;
    }
    let mut why = Vec::new();
    let full = d.ring_full_total();
    if full > 0 {
        let per_cpu: Vec<String> = d
            .ring_full
            .iter()
            .enumerate()
            .filter(|&(_, &n)| n > 0)
            .map(|(cpu, &n)| format!("vCPU {cpu}: {}", thousands(n)))
            .collect();
        let mut s = format!(
            "ring full (no free slot for the guest's record) on {}",
            per_cpu.join(", ")
        );
        // Of those: the drain read too slowly, or waited at a slot its
        // writer had reserved and not filled yet.
        let behind = full.saturating_sub(d.held);
        if behind > 0 {
            s.push_str(&format!(
                "; {} of them with the drain behind",
                thousands(behind)
            ));
        }
        if d.held > 0 {
            s.push_str(&format!(
                "; {} of them while the drain was held at a record not committed yet",
                thousands(d.held)
            ));
        }
        why.push(s);
    }
    if d.capped() {
        why.push(format!(
            "rings of {} records, {} asked: the guest's free low memory holds no more",
            thousands(d.ring_given),
            thousands(d.ring_asked)
        ));
    }
    if d.over_budget > 0 {
        why.push(format!(
            "over the event budget: {}",
            thousands(d.over_budget)
        ));
    }
    if d.overwritten > 0 {
        why.push(format!(
            "overwritten by newer ones: {}",
            thousands(d.overwritten)
        ));
    }
    let lost: u64 = m.lost.iter().sum();
    if lost > 0 {
        why.push(format!(
            "the data file's writer behind: {}",
            thousands(lost)
        ));
    }
    let counted_only = m.events_dropped + m.returns_dropped;
    let head = match counted_only {
        0 => "nothing dropped".to_string(),
        n => format!("{} counted only", thousands(n)),
    };
    Some(format!("{head}: {}", why.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::model::DropCauses;

    #[test]
    fn each_cause_is_said_with_its_count() {
        let mut m = TraceMeta {
            events_dropped: 200,
            returns_dropped: 34,
            drops: DropCauses {
                ring_full: vec![0, 200, 0, 34],
                held: 20,
                ring_asked: 8192,
                ring_given: 128,
                ..DropCauses::default()
            },
            ..TraceMeta::default()
        };
        assert_eq!(
            drops_line(&m).unwrap(),
            "234 counted only: ring full (no free slot for the guest's record) on vCPU 1: 200, \
             vCPU 3: 34; 214 of them with the drain behind; 20 of them while the drain was held \
             at a record not committed yet; \
             rings of 128 records, 8,192 asked: the guest's free low memory holds no more"
        );
        m.drops = DropCauses {
            over_budget: 234,
            ..DropCauses::default()
        };
        assert_eq!(
            drops_line(&m).unwrap(),
            "234 counted only: over the event budget: 234"
        );
        m.drops = DropCauses::default();
        assert_eq!(drops_line(&m), None);
        // Only the rings sized down: said, with nothing dropped.
        m.events_dropped = 0;
        m.returns_dropped = 0;
        m.drops = DropCauses {
            ring_asked: 8192,
            ring_given: 64,
            ..DropCauses::default()
        };
        assert_eq!(
            drops_line(&m).unwrap(),
            "nothing dropped: rings of 64 records, 8,192 asked: the guest's free low memory \
             holds no more"
        );
    }
}
