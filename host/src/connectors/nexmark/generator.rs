//! The Nexmark generator, after the reference (Apache Beam's `NexmarkGenerator`, which Flink's
//! and RisingWave's Nexmark sources follow): a pure function from an event number to an event,
//! so a source rewinds by remembering one number.
//!
//! - Event `n` (after out-of-order adjustment, below) is a person when `n mod 50 < 1`, an
//!   auction when `< 4`, else a bid: the proportions 1 : 3 : 46.
//! - Its timestamp is `base_time + n / events_per_second` (ms).
//! - Out-of-orderness: positions are shuffled within groups of `out_of_order_group_size`
//!   (`base + (n * 953) mod size`), as the reference does; the watermark after a position is
//!   the first timestamp of its group.
//! - Ids: persons and auctions count up from 1000 as they are created; a new auction's seller
//!   is a hot seller (every 100th person) with probability 3/4, else one of the last 1000
//!   people (or up to 10 not yet created); a bid's auction is a hot auction (every 100th) with
//!   probability 1/2, else one of the last 100 auctions (or up to 10 ahead); its bidder a hot
//!   bidder with probability 3/4. Prices are `round(10^(6 u) * 100)` for uniform `u`, so
//!   log-uniform between 1.00 and 1 000 000.00. Auctions expire within twice the time it takes
//!   100 more auctions to open. Strings are random lowercase words; `extra` pads each event to
//!   the reference's average sizes (person 200, auction 500, bid 100 bytes).
//! - Randomness: a splitmix64 stream seeded by `(seed, event id)`; not Java's `Random`, so the
//!   values differ from Beam's while their distributions are the same.

use super::model::Event;
use crate::connectors::generator::splitmix64;
pub use crate::graph::logical::NexmarkParams as Params;

const PERSON_PROPORTION: u64 = 1;
const AUCTION_PROPORTION: u64 = 3;
const TOTAL_PROPORTION: u64 = 50;
const FIRST_PERSON_ID: u64 = 1000;
const FIRST_AUCTION_ID: u64 = 1000;
const FIRST_CATEGORY_ID: u64 = 10;
const NUM_CATEGORIES: u64 = 5;
const PERSON_ID_LEAD: u64 = 10;
const AUCTION_ID_LEAD: u64 = 10;
/// The reference's number of active people (the default of [`Params::active_people`]).
pub const NUM_ACTIVE_PEOPLE: u64 = 1000;
const NUM_IN_FLIGHT_AUCTIONS: u64 = 100;
const HOT_SELLER_RATIO: u64 = 100;
const HOT_AUCTION_RATIO: u64 = 100;
const HOT_BIDDER_RATIO: u64 = 100;
const HOT_AUCTIONS_1_IN: u64 = 2;
const HOT_SELLERS_1_IN: u64 = 4;
const HOT_BIDDERS_1_IN: u64 = 4;
const CHANNELS: u64 = 10_000;
const HOT_CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
const HOT_URLS: [&str; 4] = [
    "https://www.nexmark.com/googl/e_/iem/item.htm?query=1",
    "https://www.nexmark.com/faceb/oo/kkc/item.htm?query=1",
    "https://www.nexmark.com/baidu/s_/ea/item.htm?query=1",
    "https://www.nexmark.com/apple/ma/cos/item.htm?query=1",
];
const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const US_CITIES: [&str; 10] =
    ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"];
const FIRST_NAMES: [&str; 11] =
    ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"];
const LAST_NAMES: [&str; 9] = ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"];
const AVG_PERSON_BYTES: usize = 200;
const AVG_AUCTION_BYTES: usize = 500;
const AVG_BID_BYTES: usize = 100;

/// What kind of event number `n` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// 1 in 50.
    Person,
    /// 3 in 50.
    Auction,
    /// 46 in 50.
    Bid,
}

/// The kind of event number `n`.
pub fn kind(n: u64) -> Kind {
    match n % TOTAL_PROPORTION {
        r if r < PERSON_PROPORTION => Kind::Person,
        r if r < PERSON_PROPORTION + AUCTION_PROPORTION => Kind::Auction,
        _ => Kind::Bid,
    }
}

impl Params {
    /// The event number at stream position `i` (shuffled within its group).
    pub fn adjusted(&self, i: u64) -> u64 {
        let g = self.out_of_order_group_size.max(1);
        (i / g) * g + (i.wrapping_mul(953)) % g
    }

    /// Timestamp of event number `n`, ms.
    pub fn timestamp(&self, n: u64) -> i64 {
        let us = (n as u128 * 1_000_000 / self.events_per_second.max(1) as u128) as i64;
        self.base_time_ms.saturating_add(us / 1000)
    }

    /// A watermark once every position before `next` has been emitted: no later position has
    /// an earlier timestamp than its group's first.
    pub fn watermark_before(&self, next: u64) -> i64 {
        let g = self.out_of_order_group_size.max(1);
        self.timestamp((next / g) * g).saturating_sub(1)
    }

    /// The event at stream position `i` (decoded from what [`Params::encode`] writes).
    pub fn event(&self, i: u64) -> Event {
        let mut out = Vec::with_capacity(512);
        self.encode(i, &mut out);
        Event::decode(&out).expect("an event just encoded decodes")
    }

    /// Appends the encoding of the event at position `i` (the layout of `model.rs`) to `out`,
    /// written in place without building strings; its key and timestamp.
    pub fn encode(&self, i: u64, out: &mut Vec<u8>) -> (u64, i64) {
        let n = self.adjusted(i);
        let mut r = Rng(splitmix64(self.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        let ts = self.timestamp(n);
        let key = match kind(n) {
            Kind::Person => write_person(n, ts, &mut r, out),
            Kind::Auction => self.write_auction(n, ts, &mut r, out),
            Kind::Bid => write_bid(n, ts, self.active_people, &mut r, out),
        };
        (key, ts)
    }

    fn write_auction(&self, n: u64, ts: i64, r: &mut Rng, out: &mut Vec<u8>) -> u64 {
        let id = last_auction(n) + FIRST_AUCTION_ID;
        let seller = if r.below(HOT_SELLERS_1_IN) > 0 {
            (last_person(n) / HOT_SELLER_RATIO) * HOT_SELLER_RATIO
        } else {
            some_person(n, self.active_people, r)
        } + FIRST_PERSON_ID;
        let category = FIRST_CATEGORY_ID + r.below(NUM_CATEGORIES);
        let initial_bid = price(r);
        // Within twice the time 100 more auctions take to open.
        let ahead = NUM_IN_FLIGHT_AUCTIONS * TOTAL_PROPORTION / AUCTION_PROPORTION;
        let horizon = self.timestamp(n.saturating_add(ahead)).saturating_sub(ts).max(0) as u64;
        let expires = ts.saturating_add(1 + r.below(horizon.saturating_mul(2).max(1)) as i64);
        let (mut item_name, mut description) = ([0u8; 128], [0u8; 128]);
        let item_name = r.word_into(20, &mut item_name);
        let description = r.word_into(100, &mut description);
        let reserve = initial_bid + price(r);
        out.push(super::model::AUCTION);
        for v in [id, initial_bid, reserve, ts as u64, expires as u64, seller, category] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        put(out, item_name);
        put(out, description);
        let size = 8 * 7 + item_name.len() + description.len();
        put_extra(r, size, AVG_AUCTION_BYTES, out);
        id
    }
}

fn write_person(n: u64, ts: i64, r: &mut Rng, out: &mut Vec<u8>) -> u64 {
    let id = last_person(n) + FIRST_PERSON_ID;
    out.push(super::model::PERSON);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&ts.to_le_bytes());
    let strings = out.len();
    let first = FIRST_NAMES[r.below(11) as usize].as_bytes();
    put_parts(out, &[first, b" ", LAST_NAMES[r.below(9) as usize].as_bytes()]);
    let (mut user, mut domain) = ([0u8; 128], [0u8; 128]);
    let user = r.word_into(7, &mut user);
    let domain = r.word_into(5, &mut domain);
    put_parts(out, &[user, b"@", domain, b".com"]);
    let mut card = [b' '; 19];
    for g in 0..4 {
        let mut v = r.below(10_000);
        for d in (0..4).rev() {
            card[g * 5 + d] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    }
    put(out, &card);
    put(out, US_CITIES[r.below(10) as usize].as_bytes());
    put(out, US_STATES[r.below(6) as usize].as_bytes());
    // 8 * 2 for the numbers, and the strings without their length prefixes.
    let size = 8 * 2 + (out.len() - strings - 2 * 5);
    put_extra(r, size, AVG_PERSON_BYTES, out);
    id
}

/// The `extra` string of an event of `size` bytes so far.
fn put_extra(r: &mut Rng, size: usize, average: usize, out: &mut Vec<u8>) {
    let at = out.len();
    out.extend_from_slice(&[0, 0]);
    let len = r.extra_into(size, average, out);
    out[at..at + 2].copy_from_slice(&(len as u16).to_le_bytes());
}

/// Writes bid event `n` (at `ts`) in the encoding of [`Event::encode`]; its key (the auction).
fn write_bid(n: u64, ts: i64, active: u64, r: &mut Rng, out: &mut Vec<u8>) -> u64 {
    let auction = if r.below(HOT_AUCTIONS_1_IN) > 0 {
        (last_auction(n) / HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
    } else {
        some_auction(n, r)
    } + FIRST_AUCTION_ID;
    let bidder = if r.below(HOT_BIDDERS_1_IN) > 0 {
        (last_person(n) / HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
    } else {
        some_person(n, active, r)
    } + FIRST_PERSON_ID;
    let price = price(r);
    out.push(super::model::BID);
    for v in [auction, bidder, price, ts as u64] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let start = out.len();
    if r.below(2) > 0 {
        let i = r.below(4) as usize;
        put(out, HOT_CHANNELS[i].as_bytes());
        put(out, HOT_URLS[i].as_bytes());
    } else {
        let c = r.below(CHANNELS);
        let mut digits = itoa(c);
        put_parts(out, &[b"channel-", digits.as_bytes()]);
        digits = itoa(c);
        put_parts(out, &[b"https://www.nexmark.com/item.htm?query=1&channel_id=", digits.as_bytes()]);
    }
    let size = 8 * 4 + (out.len() - start - 4);
    put_extra(r, size, AVG_BID_BYTES, out);
    auction
}

/// Decimal digits of `v`.
struct Digits {
    buf: [u8; 20],
    from: usize,
}

impl Digits {
    fn as_bytes(&self) -> &[u8] {
        &self.buf[self.from..]
    }
}

fn itoa(mut v: u64) -> Digits {
    let mut d = Digits { buf: [0; 20], from: 20 };
    loop {
        d.from -= 1;
        d.buf[d.from] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return d;
        }
    }
}

/// A string of the encoding: u16 length, bytes.
fn put(out: &mut Vec<u8>, s: &[u8]) {
    put_parts(out, &[s]);
}

fn put_parts(out: &mut Vec<u8>, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    out.extend_from_slice(&(len as u16).to_le_bytes());
    for p in parts {
        out.extend_from_slice(p);
    }
}

/// 0-based id of the last person created at or before event `n`.
#[allow(clippy::unnecessary_min_or_max)] // the reference's formula, general in the proportions
fn last_person(n: u64) -> u64 {
    let (epoch, offset) = (n / TOTAL_PROPORTION, n % TOTAL_PROPORTION);
    epoch * PERSON_PROPORTION + offset.min(PERSON_PROPORTION - 1)
}

/// 0-based id of the last auction created at or before event `n` (wrapping below 0 before
/// the first: callers add the first id).
fn last_auction(n: u64) -> u64 {
    let (epoch, offset) = (n / TOTAL_PROPORTION, n % TOTAL_PROPORTION);
    if offset < PERSON_PROPORTION {
        (epoch * AUCTION_PROPORTION).wrapping_sub(1)
    } else if offset >= PERSON_PROPORTION + AUCTION_PROPORTION {
        epoch * AUCTION_PROPORTION + AUCTION_PROPORTION - 1
    } else {
        epoch * AUCTION_PROPORTION + offset - PERSON_PROPORTION
    }
}

/// One of the `active` newest people (or a few not yet created).
fn some_person(n: u64, active: u64, r: &mut Rng) -> u64 {
    let people = last_person(n) + 1;
    let active = people.min(active.max(1));
    people - active + r.below(active + PERSON_ID_LEAD)
}

/// One of the auctions in flight (or a few not yet opened).
fn some_auction(n: u64, r: &mut Rng) -> u64 {
    let last = last_auction(n);
    let last = if last == u64::MAX { 0 } else { last };
    let min = last.saturating_sub(NUM_IN_FLIGHT_AUCTIONS);
    min + r.below(last - min + 1 + AUCTION_ID_LEAD)
}

/// `round(10^(6u) * 100)`, u uniform in [0, 1).
fn price(r: &mut Rng) -> u64 {
    ((r.unit() * 6.0 * std::f64::consts::LN_10).exp() * 100.0).round() as u64
}

/// The random stream of one event.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = splitmix64(self.0);
        self.0
    }

    /// Uniform in `[0, n)` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A word of 3 to `max - 1` (<= 128) lowercase letters with a space now and then, written
    /// into `buf`; the word, trimmed.
    fn word_into<'b>(&mut self, max: u64, buf: &'b mut [u8; 128]) -> &'b [u8] {
        let len = (3 + self.below(max - 3)) as usize;
        let mut bits = 0u64;
        for (i, b) in buf[..len].iter_mut().enumerate() {
            if i % 10 == 0 {
                bits = self.next();
            }
            let c = (bits & 0x3f) % 28;
            bits >>= 6;
            *b = if c >= 26 { b' ' } else { b'a' + c as u8 };
        }
        buf[..len].trim_ascii()
    }

    /// Letters padding an event of `size` bytes towards `average` (±20 %, as the reference),
    /// appended to `out`; how many.
    fn extra_into(&mut self, size: usize, average: usize, out: &mut Vec<u8>) -> usize {
        if size > average {
            return 0;
        }
        let want = average - size;
        let delta = (want as f64 * 0.2).round() as u64;
        let len = (want as u64 - delta + if delta == 0 { 0 } else { self.below(2 * delta) }) as usize;
        out.reserve(len);
        let mut bits = 0u64;
        for i in 0..len {
            if i % 12 == 0 {
                bits = self.next();
            }
            out.push(b'a' + ((bits & 0x1f) % 26) as u8);
            bits >>= 5;
        }
        len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        Params {
            seed: 7,
            events_per_second: 10_000,
            base_time_ms: 1_000_000,
            out_of_order_group_size: 1,
            active_people: NUM_ACTIVE_PEOPLE,
        }
    }

    #[test]
    fn proportions_ids_and_timestamps_follow_the_reference() {
        let p = params();
        let events: Vec<Event> = (0..5000).map(|i| p.event(i)).collect();
        let count = |k: fn(&Event) -> bool| events.iter().filter(|e| k(e)).count();
        assert_eq!(count(|e| matches!(e, Event::Person(_))), 100);
        assert_eq!(count(|e| matches!(e, Event::Auction(_))), 300);
        assert_eq!(count(|e| matches!(e, Event::Bid(_))), 4600);
        // Persons and auctions are numbered in order of creation from 1000.
        let persons: Vec<u64> =
            events.iter().filter_map(|e| if let Event::Person(p) = e { Some(p.id) } else { None }).collect();
        assert_eq!(persons, (1000..1100).collect::<Vec<_>>());
        let auctions: Vec<u64> =
            events.iter().filter_map(|e| if let Event::Auction(a) = e { Some(a.id) } else { None }).collect();
        assert_eq!(auctions, (1000..1300).collect::<Vec<_>>());
        // 10 000 events per second: event 20 000 is two seconds in.
        assert_eq!(p.timestamp(0), 1_000_000);
        assert_eq!(p.timestamp(20_000), 1_002_000);
        assert!(events.windows(2).all(|w| w[0].date_time() <= w[1].date_time()));
        // Bids reference auctions that exist or are about to; half of them the hot ones.
        let mut hot = 0;
        for (i, e) in events.iter().enumerate() {
            if let Event::Bid(b) = e {
                let last = 1000 + last_auction(i as u64);
                assert!(b.auction <= last + AUCTION_ID_LEAD, "bid {i} on auction {} (last {last})", b.auction);
                hot += usize::from(b.auction % 100 == 0);
                assert!((100..=100_000_000).contains(&b.price), "{}", b.price);
            }
        }
        assert!((2000..2700).contains(&hot), "hot-auction bids: {hot} of 4600");
    }

    #[test]
    fn encoded_events_decode_and_encode_again_byte_for_byte() {
        let p = Params { out_of_order_group_size: 16, ..params() };
        for i in 0..3000 {
            let (mut fast, mut model) = (Vec::new(), Vec::new());
            let (key, ts) = p.encode(i, &mut fast);
            let e = p.event(i);
            e.encode(&mut model);
            assert_eq!(fast, model, "position {i}");
            assert_eq!((key, ts), (e.key(), e.date_time()));
            assert_eq!(Event::decode(&model).as_ref(), Some(&e));
        }
    }

    #[test]
    fn events_are_a_pure_function_of_their_position_and_seed() {
        let p = params();
        assert_eq!(p.event(1234), p.event(1234));
        let other = Params { seed: 8, ..p };
        assert_ne!(p.event(1234), other.event(1234));
        // Average sizes near the reference's.
        let mut bytes = Vec::new();
        let bids: Vec<Event> = (0..2000).map(|i| p.event(i)).filter(|e| matches!(e, Event::Bid(_))).collect();
        for b in &bids {
            b.encode(&mut bytes);
        }
        let avg = bytes.len() / bids.len();
        assert!((80..140).contains(&avg), "average encoded bid: {avg} bytes");
    }

    #[test]
    fn out_of_order_groups_shuffle_positions_and_the_watermark_holds() {
        let p = Params { out_of_order_group_size: 16, ..params() };
        let mut numbers: Vec<u64> = (0..64).map(|i| p.adjusted(i)).collect();
        assert_ne!(numbers, (0..64).collect::<Vec<_>>(), "shuffled");
        numbers.sort();
        assert_eq!(numbers, (0..64).collect::<Vec<_>>(), "a permutation");
        for next in 1..200u64 {
            let wm = p.watermark_before(next);
            assert!((next..next + 100).all(|i| p.event(i).date_time() > wm), "position {next}");
        }
    }
}
