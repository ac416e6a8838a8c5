//! Decoders for the events of a `nexmark` source (the online-auction benchmark): the record
//! value is one person, auction or bid in a compact binary layout, numbers first:
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
//! The record key is the event's id as a little-endian u64 (a bid's: its auction), the record
//! timestamp its `date_time`. [`decode`] borrows the strings from the record; [`bid`] reads
//! only a bid's numbers (the hot path of most queries).
//!
//! Invariant: decoding never reads past the value; a short or malformed value is an error
//! naming what is wrong, never a panic.

use crate::{Error, Result};

/// A person registering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Person<'a> {
    /// Person id.
    pub id: u64,
    /// When, ms.
    pub date_time: i64,
    /// Name.
    pub name: &'a str,
    /// E-mail address.
    pub email_address: &'a str,
    /// Credit card number.
    pub credit_card: &'a str,
    /// City.
    pub city: &'a str,
    /// US state code.
    pub state: &'a str,
    /// Padding.
    pub extra: &'a str,
}

/// An auction opening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Auction<'a> {
    /// Auction id.
    pub id: u64,
    /// Starting price, cents.
    pub initial_bid: u64,
    /// Reserve price, cents.
    pub reserve: u64,
    /// When it opened, ms.
    pub date_time: i64,
    /// When it closes, ms.
    pub expires: i64,
    /// Seller's person id.
    pub seller: u64,
    /// Category id.
    pub category: u64,
    /// Item name.
    pub item_name: &'a str,
    /// Description.
    pub description: &'a str,
    /// Padding.
    pub extra: &'a str,
}

/// A bid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bid<'a> {
    /// Auction id.
    pub auction: u64,
    /// Bidder's person id.
    pub bidder: u64,
    /// Price, cents.
    pub price: u64,
    /// When, ms.
    pub date_time: i64,
    /// Channel.
    pub channel: &'a str,
    /// URL.
    pub url: &'a str,
    /// Padding.
    pub extra: &'a str,
}

/// A bid's numbers only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BidNumbers {
    /// Auction id.
    pub auction: u64,
    /// Bidder's person id.
    pub bidder: u64,
    /// Price, cents.
    pub price: u64,
    /// When, ms.
    pub date_time: i64,
}

/// One event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// Kind 0.
    Person(Person<'a>),
    /// Kind 1.
    Auction(Auction<'a>),
    /// Kind 2.
    Bid(Bid<'a>),
}

/// Kind byte of a person.
pub const PERSON: u8 = 0;
/// Kind byte of an auction.
pub const AUCTION: u8 = 1;
/// Kind byte of a bid.
pub const BID: u8 = 2;

/// The kind byte of an event value (`None` when empty).
#[inline]
pub fn kind(value: &[u8]) -> Option<u8> {
    value.first().copied()
}

/// A bid's numbers, or `None` when `value` is not a bid.
#[inline]
pub fn bid(value: &[u8]) -> Option<BidNumbers> {
    if value.len() < 33 || value[0] != BID {
        return None;
    }
    let n = |i: usize| u64::from_le_bytes(value[1 + 8 * i..9 + 8 * i].try_into().unwrap());
    Some(BidNumbers { auction: n(0), bidder: n(1), price: n(2), date_time: n(3) as i64 })
}

/// A bid with its strings as raw bytes (not checked for UTF-8: for queries that copy them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawBid<'a> {
    /// The numbers.
    pub numbers: BidNumbers,
    /// Channel bytes.
    pub channel: &'a [u8],
    /// URL bytes.
    pub url: &'a [u8],
    /// Padding bytes.
    pub extra: &'a [u8],
}

/// A bid's numbers and unchecked strings, or `None` when `value` is not a well-formed bid.
#[inline]
pub fn raw_bid(value: &[u8]) -> Option<RawBid<'_>> {
    let numbers = bid(value)?;
    let mut c = Reader { buf: value, at: 33 };
    let mut raw = || -> Option<&[u8]> {
        let n = u16::from_le_bytes(c.take(2).ok()?.try_into().ok()?) as usize;
        c.take(n).ok()
    };
    Some(RawBid { numbers, channel: raw()?, url: raw()?, extra: raw()? })
}

/// The key of a record of a `nexmark` source (or any little-endian u64 key).
#[inline]
pub fn key(key: &[u8]) -> Option<u64> {
    key.try_into().ok().map(u64::from_le_bytes)
}

/// Decodes an event.
pub fn decode(value: &[u8]) -> Result<Event<'_>> {
    let mut c = Reader { buf: value, at: 1 };
    match kind(value) {
        Some(PERSON) => Ok(Event::Person(Person {
            id: c.u64()?,
            date_time: c.u64()? as i64,
            name: c.str()?,
            email_address: c.str()?,
            credit_card: c.str()?,
            city: c.str()?,
            state: c.str()?,
            extra: c.str()?,
        })),
        Some(AUCTION) => Ok(Event::Auction(Auction {
            id: c.u64()?,
            initial_bid: c.u64()?,
            reserve: c.u64()?,
            date_time: c.u64()? as i64,
            expires: c.u64()? as i64,
            seller: c.u64()?,
            category: c.u64()?,
            item_name: c.str()?,
            description: c.str()?,
            extra: c.str()?,
        })),
        Some(BID) => Ok(Event::Bid(Bid {
            auction: c.u64()?,
            bidder: c.u64()?,
            price: c.u64()?,
            date_time: c.u64()? as i64,
            channel: c.str()?,
            url: c.str()?,
            extra: c.str()?,
        })),
        Some(k) => Err(Error::msg(format!("not a Nexmark event: kind byte {k} (0 person, 1 auction, 2 bid)"))),
        None => Err(Error::msg("not a Nexmark event: the value is empty")),
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| {
            Error::msg(format!(
                "Nexmark event truncated: {n} bytes needed at offset {}, {} there",
                self.at,
                self.buf.len()
            ))
        })?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }

    fn str(&mut self) -> Result<&'a str> {
        let n = u16::from_le_bytes(self.take(2)?.try_into().unwrap()) as usize;
        let at = self.at;
        std::str::from_utf8(self.take(n)?)
            .map_err(|e| Error::msg(format!("Nexmark event: the string at offset {at} is not UTF-8: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bid_bytes() -> Vec<u8> {
        let mut v = vec![BID];
        for n in [1001u64, 1002, 350, 1_436_918_400_000] {
            v.extend_from_slice(&n.to_le_bytes());
        }
        for s in ["Google", "https://x", ""] {
            v.extend_from_slice(&(s.len() as u16).to_le_bytes());
            v.extend_from_slice(s.as_bytes());
        }
        v
    }

    #[test]
    fn decodes_a_bid_fully_and_by_its_numbers() {
        let v = bid_bytes();
        let Event::Bid(b) = decode(&v).unwrap() else { panic!("a bid") };
        assert_eq!(
            (b.auction, b.bidder, b.price, b.channel, b.url, b.extra),
            (1001, 1002, 350, "Google", "https://x", "")
        );
        let n = bid(&v).unwrap();
        assert_eq!((n.auction, n.price, n.date_time), (1001, 350, 1_436_918_400_000));
        let r = raw_bid(&v).unwrap();
        assert_eq!((r.numbers, r.channel, r.url, r.extra), (n, &b"Google"[..], &b"https://x"[..], &b""[..]));
        assert!(raw_bid(&v[..v.len() - 1]).is_none());
        assert_eq!(key(&1001u64.to_le_bytes()), Some(1001));
    }

    #[test]
    fn malformed_values_are_errors_not_panics() {
        let v = bid_bytes();
        for cut in 0..v.len() {
            let _ = decode(&v[..cut]);
        }
        assert!(decode(&v[..20]).unwrap_err().message().contains("truncated"));
        assert!(decode(&[9]).unwrap_err().message().contains("kind byte 9"));
        assert!(bid(&[AUCTION; 40]).is_none());
        let mut bad = v.clone();
        let at = bad.len() - 5; // inside "https://x"
        bad[at] = 0xff;
        assert!(decode(&bad).unwrap_err().message().contains("not UTF-8"));
    }
}
