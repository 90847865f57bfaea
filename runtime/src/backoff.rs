//! Backoff: the one exponential formula, the jittered and capped pause of
//! a job's retries, and the doubling pause of idle pollers and outage
//! retries.

use std::time::Duration;

/// `base × 2^(attempt−1)`, saturating; attempts below 1 count as 1.
#[must_use]
pub fn exponential(base: Duration, attempt: i32) -> Duration {
    let exponent = u32::try_from(attempt.saturating_sub(1).clamp(0, 30)).unwrap_or(0);
    base.saturating_mul(1u32 << exponent)
}

/// The pause before a job's next attempt after its `attempt`th failed:
/// `base × 2^(attempt−1)` capped at `max`, its upper half spread by
/// `spread` (from 0 to 1). Jobs that failed together on one outage come
/// back over that half instead of at one instant, and none comes back
/// sooner than half its exponential pause ("equal jitter").
#[must_use]
pub fn jittered(base: Duration, attempt: i32, max: Duration, spread: f64) -> Duration {
    let full = exponential(base, attempt).min(max);
    let half = full / 2;
    let spread = if spread.is_finite() {
        spread.clamp(0.0, 1.0)
    } else {
        0.0
    };
    half + (full - half).mul_f64(spread)
}

/// A pause that doubles from `min` up to `max` each time it is taken, and
/// starts over after [`Doubling::reset`]: idle polling and outage retries.
#[derive(Debug, Clone)]
pub struct Doubling {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Doubling {
    #[must_use]
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            next: min,
        }
    }

    /// The pause to take now; the next one is twice as long, up to `max`.
    pub fn next_pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        pause
    }

    /// Back to `min` (work was found, or the outage is over).
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_doubles_from_the_base() {
        let base = Duration::from_secs(5);
        assert_eq!(exponential(base, 1), Duration::from_secs(5));
        assert_eq!(exponential(base, 2), Duration::from_secs(10));
        assert_eq!(exponential(base, 3), Duration::from_secs(20));
        assert_eq!(exponential(base, 0), Duration::from_secs(5));
        assert_eq!(exponential(base, i32::MAX), base.saturating_mul(1 << 30));
    }

    #[test]
    fn jittered_pauses_lie_in_the_upper_half_of_the_capped_exponential() {
        let (base, max) = (Duration::from_secs(5), Duration::from_secs(60));
        assert_eq!(jittered(base, 1, max, 0.0), Duration::from_millis(2_500));
        assert_eq!(jittered(base, 1, max, 1.0), Duration::from_secs(5));
        assert_eq!(jittered(base, 2, max, 0.5), Duration::from_millis(7_500));
        // Capped: attempt 10 would be 2,560 s.
        assert_eq!(jittered(base, 10, max, 1.0), max);
        assert_eq!(jittered(base, 10, max, 0.0), max / 2);
        // Out-of-range spreads are held to the range.
        assert_eq!(jittered(base, 1, max, 7.0), Duration::from_secs(5));
        assert_eq!(
            jittered(base, 1, max, f64::NAN),
            Duration::from_millis(2_500)
        );
    }

    #[test]
    fn doubling_stops_at_its_max_and_resets_to_its_min() {
        let mut pause = Doubling::new(Duration::from_millis(10), Duration::from_millis(35));
        let taken: Vec<u128> = (0..4).map(|_| pause.next_pause().as_millis()).collect();
        assert_eq!(taken, [10, 20, 35, 35]);
        pause.reset();
        assert_eq!(pause.next_pause(), Duration::from_millis(10));
    }
}
