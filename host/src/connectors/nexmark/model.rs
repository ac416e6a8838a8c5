//! The Nexmark event model (persons, auctions, bids) and its compact binary encoding, the
//! record value of a `nexmark` source. The SDKs decode it (`weir_guest::nexmark` and the C,
//! JavaScript and Python helpers); the layout is fixed:
//!
//! ```text
//! u8 kind                 0 = person, 1 = auction, 2 = bid
//! person:  u64 id, i64 date_time,
//!          str name, str email_address, str credit_card, str city, str state, str extra
//! auction: u64 id, u64 initial_bid, u64 reserve, i64 date_time, i64 expires, u64 seller,
//!          u64 category, str item_name, str description, str extra
//! bid:     u64 auction, u64 bidder, u64 price, i64 date_time, str channel, str url, str extra
//! str = u16 length, then that many UTF-8 bytes; integers little-endian
//! ```
//!
//! Numbers come first, at fixed offsets, so a query that needs only them reads no string. The
//! record's key is the event's own id as a little-endian u64 (person id, auction id, and for a
//! bid its auction), its timestamp `date_time`.
//!
//! Invariant: `encode` writes exactly the layout above; strings are shorter than 64 KiB (the
//! generator's longest is a few hundred bytes).

/// A person registering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    /// Person id (from 1000, in order of creation).
    pub id: u64,
    /// When the person registered, ms.
    pub date_time: i64,
    /// First and last name.
    pub name: String,
    /// E-mail address.
    pub email_address: String,
    /// Four groups of four digits.
    pub credit_card: String,
    /// A US city.
    pub city: String,
    /// A US state code.
    pub state: String,
    /// Padding towards the average event size.
    pub extra: String,
}

/// An auction opening.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auction {
    /// Auction id (from 1000, in order of creation).
    pub id: u64,
    /// Starting price, cents.
    pub initial_bid: u64,
    /// Reserve price, cents (above the initial bid).
    pub reserve: u64,
    /// When the auction opened, ms.
    pub date_time: i64,
    /// When it closes, ms.
    pub expires: i64,
    /// Person id of the seller.
    pub seller: u64,
    /// Category id, 10 to 14.
    pub category: u64,
    /// Item name.
    pub item_name: String,
    /// Item description.
    pub description: String,
    /// Padding towards the average event size.
    pub extra: String,
}

/// A bid on an auction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bid {
    /// Auction id bid on.
    pub auction: u64,
    /// Person id of the bidder.
    pub bidder: u64,
    /// Price, cents.
    pub price: u64,
    /// When the bid was made, ms.
    pub date_time: i64,
    /// Where the bid came from.
    pub channel: String,
    /// The page it came from.
    pub url: String,
    /// Padding towards the average event size.
    pub extra: String,
}

/// One Nexmark event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A new person.
    Person(Person),
    /// A new auction.
    Auction(Auction),
    /// A bid.
    Bid(Bid),
}

/// Kind bytes of the encoding.
pub const PERSON: u8 = 0;
/// See [`PERSON`].
pub const AUCTION: u8 = 1;
/// See [`PERSON`].
pub const BID: u8 = 2;

impl Event {
    /// Event time, ms.
    pub fn date_time(&self) -> i64 {
        match self {
            Event::Person(p) => p.date_time,
            Event::Auction(a) => a.date_time,
            Event::Bid(b) => b.date_time,
        }
    }

    /// The record key: the event's own id (a bid's auction).
    pub fn key(&self) -> u64 {
        match self {
            Event::Person(p) => p.id,
            Event::Auction(a) => a.id,
            Event::Bid(b) => b.auction,
        }
    }

    /// Appends the binary encoding.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Event::Person(p) => {
                out.push(PERSON);
                out.extend_from_slice(&p.id.to_le_bytes());
                out.extend_from_slice(&p.date_time.to_le_bytes());
                for s in [&p.name, &p.email_address, &p.credit_card, &p.city, &p.state, &p.extra] {
                    put_str(out, s);
                }
            }
            Event::Auction(a) => {
                out.push(AUCTION);
                for n in [a.id, a.initial_bid, a.reserve] {
                    out.extend_from_slice(&n.to_le_bytes());
                }
                out.extend_from_slice(&a.date_time.to_le_bytes());
                out.extend_from_slice(&a.expires.to_le_bytes());
                out.extend_from_slice(&a.seller.to_le_bytes());
                out.extend_from_slice(&a.category.to_le_bytes());
                for s in [&a.item_name, &a.description, &a.extra] {
                    put_str(out, s);
                }
            }
            Event::Bid(b) => {
                out.push(BID);
                for n in [b.auction, b.bidder, b.price] {
                    out.extend_from_slice(&n.to_le_bytes());
                }
                out.extend_from_slice(&b.date_time.to_le_bytes());
                for s in [&b.channel, &b.url, &b.extra] {
                    put_str(out, s);
                }
            }
        }
    }
}

impl Event {
    /// Decodes [`Event::encode`]'s layout (`None` if it is not one).
    pub fn decode(b: &[u8]) -> Option<Event> {
        let mut r = Reader { b, at: 1 };
        Some(match *b.first()? {
            PERSON => Event::Person(Person {
                id: r.u64()?,
                date_time: r.u64()? as i64,
                name: r.str()?,
                email_address: r.str()?,
                credit_card: r.str()?,
                city: r.str()?,
                state: r.str()?,
                extra: r.str()?,
            }),
            AUCTION => Event::Auction(Auction {
                id: r.u64()?,
                initial_bid: r.u64()?,
                reserve: r.u64()?,
                date_time: r.u64()? as i64,
                expires: r.u64()? as i64,
                seller: r.u64()?,
                category: r.u64()?,
                item_name: r.str()?,
                description: r.str()?,
                extra: r.str()?,
            }),
            BID => Event::Bid(Bid {
                auction: r.u64()?,
                bidder: r.u64()?,
                price: r.u64()?,
                date_time: r.u64()? as i64,
                channel: r.str()?,
                url: r.str()?,
                extra: r.str()?,
            }),
            _ => return None,
        })
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn str(&mut self) -> Option<String> {
        let n = u16::from_le_bytes(self.take(2)?.try_into().ok()?) as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let n = s.len().min(u16::MAX as usize);
    out.extend_from_slice(&(n as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..n]);
}
