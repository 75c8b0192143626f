//! Summaries of measured samples (pause times, bench figures).

use std::cmp::Ordering;

/// A sample value with a total order: floats sort by `total_cmp`, so a NaN
/// cannot make the sort (and the percentile) depend on the input order.
pub trait Sample: Copy {
    fn order(&self, other: &Self) -> Ordering;
}

impl Sample for u64 {
    fn order(&self, other: &Self) -> Ordering {
        self.cmp(other)
    }
}

impl Sample for f64 {
    fn order(&self, other: &Self) -> Ordering {
        self.total_cmp(other)
    }
}

/// The p-th percentile (nearest rank, p in 0..=100) of `v`, in any order;
/// `None` for no samples.
pub fn percentile<T: Sample>(v: &[T], p: f64) -> Option<T> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_unstable_by(T::order);
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    Some(s[rank.clamp(1, s.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<u64> = (1..=10).rev().collect();
        assert_eq!(percentile(&v, 50.0), Some(5));
        assert_eq!(percentile(&v, 99.0), Some(10));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&v, 100.0), Some(10));
        assert_eq!(percentile::<u64>(&[], 50.0), None);
        assert_eq!(percentile(&[2.5, f64::NAN, 1.5], 50.0), Some(2.5));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
    }
}
