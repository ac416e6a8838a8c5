//! The `nexmark` source's options, validated: every refusal names the source, the option and
//! what to write instead.

use super::{Ctx, JobError};
use crate::connectors::nexmark::NexmarkConfig;
use crate::connectors::nexmark::generator::{NUM_ACTIVE_PEOPLE, Params};
use crate::job::spec::SourceSpec;

/// The reference generator's default event-time rate (Beam's `firstEventRate`).
pub const DEFAULT_EVENTS_PER_SECOND: u64 = 10_000;
/// Timestamp of the first event: 2015-07-15T00:00:00Z, the reference's `BASE_TIME`.
pub const DEFAULT_BASE_TIME_MS: i64 = 1_436_918_400_000;

pub(super) fn source(cx: &Ctx<'_>, s: &SourceSpec, id: &str) -> Result<NexmarkConfig, JobError> {
    let Some(count) = &s.count else {
        return cx.err(s.id.span(), format!("nexmark source `{id}` needs `count = <events>`"));
    };
    let events_per_second = match &s.events_per_second {
        None => DEFAULT_EVENTS_PER_SECOND,
        Some(r) if *r.get_ref() == 0 => {
            return cx.err(
                r.span(),
                format!(
                    "nexmark source `{id}`: events_per_second = 0 would put every event at the same instant; \
                     give the event-time rate, e.g. {DEFAULT_EVENTS_PER_SECOND}"
                ),
            );
        }
        Some(r) => *r.get_ref(),
    };
    let group = match &s.out_of_order_group_size {
        None => 1,
        Some(g) if *g.get_ref() == 0 || g.get_ref() % 953 == 0 => {
            return cx.err(
                g.span(),
                format!(
                    "nexmark source `{id}`: out_of_order_group_size must be at least 1 (in order) and not a \
                     multiple of 953 (positions are shuffled by multiplying with 953)"
                ),
            );
        }
        Some(g) => *g.get_ref(),
    };
    if let Some(a) = s.active_people.as_ref().filter(|a| *a.get_ref() == 0) {
        return cx.err(
            a.span(),
            format!(
                "nexmark source `{id}`: active_people = 0 leaves no one to bid or sell; give at least 1 \
                 (the reference uses {NUM_ACTIVE_PEOPLE})"
            ),
        );
    }
    if let Some(r) = s.rate.as_ref().filter(|r| *r.get_ref() == 0) {
        return cx
            .err(r.span(), format!("nexmark source `{id}`: rate = 0 would never emit; leave `rate` out for no limit"));
    }
    Ok(NexmarkConfig {
        count: *count.get_ref(),
        params: Params {
            seed: s.seed.as_ref().map_or(0, |v| *v.get_ref()),
            events_per_second,
            base_time_ms: s.base_time_ms.as_ref().map_or(DEFAULT_BASE_TIME_MS, |v| *v.get_ref()),
            out_of_order_group_size: group,
            active_people: s.active_people.as_ref().map_or(NUM_ACTIVE_PEOPLE, |v| *v.get_ref()),
        },
        rate: s.rate.as_ref().map(|v| *v.get_ref()),
    })
}
