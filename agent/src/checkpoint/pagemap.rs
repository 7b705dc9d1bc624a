//! CRIU's page maps (`pagemap-<pid>.img`): which of a process's virtual pages a dump
//! holds, and where each lies in its pages file (`pages-<id>.img`). A working set is
//! recorded as faulted addresses (`working_set`) and stored as chunks of the pages
//! files: this is the map between the two.
//!
//! The file (CRIU's image format, which its `images/pagemap.proto` and `magic.h` fix):
//! two little-endian `u32` magics (CRIU's common one, then the page map's), then
//! messages, each a little-endian `u32` length and that many bytes of protobuf: first a
//! `PagemapHead { uint32 pages_id = 1 }`, then `PagemapEntry { uint64 vaddr = 1;
//! uint32 compat_nr_pages = 2; bool in_parent = 3; uint32 flags = 4; uint64 nr_pages =
//! 5 }` (CRIU 3.x wrote the page count in 2 only). The pages file holds,
//! in entry order, the pages of every entry whose data is in this dump (flag
//! `PE_PRESENT`, not `PE_PARENT`); `PE_LAZY` marks entries lazy pages may serve later.

use crate::{Error, Result};

/// CRIU's `IMG_COMMON_MAGIC`, first in every image but the inventory.
const COMMON_MAGIC: u32 = 0x5456_4319;
/// CRIU's `PAGEMAP_MAGIC`.
const PAGEMAP_MAGIC: u32 = 0x5608_4025;
/// `PE_PARENT`, `PE_LAZY`, `PE_PRESENT` (CRIU's `pagemap.h`).
const PE_PARENT: u32 = 1 << 0;
const PE_LAZY: u32 = 1 << 1;
const PE_PRESENT: u32 = 1 << 2;
pub const PAGE_SIZE: u64 = 4096;
/// More entries than this is not a page map CRIU wrote for a process we could hold.
const MAX_ENTRIES: usize = 1 << 24;

/// One process's page map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pagemap {
    /// The name of its pages file, `pages-<id>.img`.
    pub pages_file: String,
    /// Its entries whose pages are in that file, in address order.
    pub entries: Vec<Entry>,
}

/// Pages `[vaddr, vaddr + pages * 4096)` at `offset` in the pages file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub vaddr: u64,
    pub pages: u64,
    pub offset: u64,
    /// Lazy pages may serve them after the restore (else the restore reads them).
    pub lazy: bool,
}

impl Pagemap {
    /// Parses `bytes`, the contents of page map `file` (for errors).
    pub fn parse(file: &str, bytes: &[u8]) -> Result<Pagemap> {
        let bad = |reason: String| Error::CriuImage {
            file: file.to_string(),
            reason,
        };
        let word = |at: usize| -> Option<u32> {
            Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
        };
        if word(0) != Some(COMMON_MAGIC) || word(4) != Some(PAGEMAP_MAGIC) {
            let start = &bytes[..bytes.len().min(8)];
            return Err(bad(format!(
                "no CRIU page map magic at its start ({} bytes, starting {})",
                bytes.len(),
                hex::encode(start)
            )));
        }
        let mut at = 8;
        let mut messages = Vec::new();
        while at < bytes.len() {
            let len = word(at).ok_or_else(|| bad(format!("a length cut off at byte {at}")))?;
            let start = at + 4;
            let end = start
                .checked_add(len as usize)
                .filter(|end| *end <= bytes.len())
                .ok_or_else(|| bad(format!("a message at byte {at} runs past the end")))?;
            if messages.len() > MAX_ENTRIES {
                return Err(bad(format!("more than {MAX_ENTRIES} entries")));
            }
            messages
                .push(fields(&bytes[start..end]).map_err(|why| bad(format!("byte {at}: {why}")))?);
            at = end;
        }
        let mut messages = messages.into_iter();
        let head = messages.next().ok_or_else(|| bad("no head".into()))?;
        let pages_id = field(&head, 1).ok_or_else(|| bad("its head has no pages_id".into()))?;
        let mut entries = Vec::new();
        let mut offset = 0u64;
        for m in messages {
            let vaddr = field(&m, 1).ok_or_else(|| bad("an entry without vaddr".into()))?;
            // `nr_pages` (5, 64 bits) where CRIU wrote it, else `compat_nr_pages` (2).
            let pages = field(&m, 5)
                .or_else(|| field(&m, 2))
                .ok_or_else(|| bad("an entry without nr_pages".into()))?;
            let in_parent = field(&m, 3).unwrap_or(0) != 0;
            // Images from before the flags were written: in the parent or here.
            let flags =
                field(&m, 4).map_or(if in_parent { PE_PARENT } else { PE_PRESENT }, |f| f as u32);
            if flags & PE_PARENT != 0 || flags & PE_PRESENT == 0 {
                continue;
            }
            if vaddr % PAGE_SIZE != 0 {
                return Err(bad(format!("an entry at {vaddr:#x}, not page-aligned")));
            }
            entries.push(Entry {
                vaddr,
                pages,
                offset,
                lazy: flags & PE_LAZY != 0,
            });
            offset = pages
                .checked_mul(PAGE_SIZE)
                .and_then(|b| offset.checked_add(b))
                .ok_or_else(|| bad("its pages add up past 2^64 bytes".into()))?;
        }
        entries.sort_by_key(|e| e.vaddr);
        Ok(Pagemap {
            pages_file: format!("pages-{pages_id}.img"),
            entries,
        })
    }

    /// Where the page at `addr` lies in the pages file, if this dump holds it.
    pub fn offset_of(&self, addr: u64) -> Option<u64> {
        let i = self
            .entries
            .partition_point(|e| e.vaddr <= addr)
            .checked_sub(1)?;
        let e = &self.entries[i];
        let page = (addr - e.vaddr) / PAGE_SIZE;
        (page < e.pages).then(|| e.offset + page * PAGE_SIZE)
    }
}

/// The varint fields of a protobuf message, `(number, value)`; other wire types are
/// skipped (none of the fields read here has one).
fn fields(mut b: &[u8]) -> std::result::Result<Vec<(u32, u64)>, String> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b)?;
        let (number, wire) = ((key >> 3) as u32, key & 7);
        match wire {
            0 => out.push((number, varint(&mut b)?)),
            1 => b = b.get(8..).ok_or("a fixed64 cut off")?,
            2 => {
                let len = varint(&mut b)? as usize;
                b = b.get(len..).ok_or("a length-delimited field cut off")?;
            }
            5 => b = b.get(4..).ok_or("a fixed32 cut off")?,
            _ => return Err(format!("wire type {wire}")),
        }
    }
    Ok(out)
}

fn varint(b: &mut &[u8]) -> std::result::Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first().ok_or("a varint cut off")?;
        *b = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a varint of more than 10 bytes".into())
}

fn field(fields: &[(u32, u64)], number: u32) -> Option<u64> {
    fields
        .iter()
        .rev()
        .find(|(n, _)| *n == number)
        .map(|(_, v)| *v)
}

/// The page faults lazy pages served, in order, from the debug log of `criu
/// lazy-pages -v4`: `(pid in the dump, page address)` of each `uffd: PID-FD: #PF at
/// 0xADDR` line. Other lines are ignored.
pub fn faults(log: &str) -> Vec<(u32, u64)> {
    log.lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once("uffd: ")?;
            let (who, addr) = rest.split_once(": #PF at 0x")?;
            let pid = who.split_once('-')?.0.parse().ok()?;
            Some((pid, u64::from_str_radix(addr.trim(), 16).ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint_bytes(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn message(fields: &[(u32, u64)]) -> Vec<u8> {
        let mut body = Vec::new();
        for (n, v) in fields {
            varint_bytes(u64::from(*n) << 3, &mut body);
            varint_bytes(*v, &mut body);
        }
        let mut out = (body.len() as u32).to_le_bytes().to_vec();
        out.extend(body);
        out
    }

    fn image(entries: &[&[(u32, u64)]]) -> Vec<u8> {
        let mut b = [COMMON_MAGIC.to_le_bytes(), PAGEMAP_MAGIC.to_le_bytes()].concat();
        b.extend(message(&[(1, 3)]));
        for e in entries {
            b.extend(message(e));
        }
        b
    }

    #[test]
    fn pages_lie_in_entry_order_skipping_what_is_not_in_the_dump() {
        let bytes = image(&[
            &[(1, 0x10000), (2, 2), (4, u64::from(PE_PRESENT))],
            &[(1, 0x20000), (2, 5), (4, u64::from(PE_PARENT))],
            &[(1, 0x30000), (2, 1), (4, 0)],
            &[
                (1, 0x7f0000),
                (2, 0),
                (4, u64::from(PE_PRESENT | PE_LAZY)),
                (5, 3),
            ],
        ]);
        let map = Pagemap::parse("pagemap-1.img", &bytes).unwrap();
        assert_eq!(map.pages_file, "pages-3.img");
        assert_eq!(
            map.entries,
            vec![
                Entry {
                    vaddr: 0x10000,
                    pages: 2,
                    offset: 0,
                    lazy: false
                },
                Entry {
                    vaddr: 0x7f0000,
                    pages: 3,
                    offset: 2 * PAGE_SIZE,
                    lazy: true
                },
            ]
        );
        assert_eq!(map.offset_of(0x11000), Some(PAGE_SIZE));
        assert_eq!(map.offset_of(0x7f2000), Some(4 * PAGE_SIZE));
        for absent in [0x0, 0x12000, 0x20000, 0x30000, 0x7f3000] {
            assert_eq!(map.offset_of(absent), None, "{absent:#x}");
        }
    }

    #[test]
    fn a_file_that_is_no_page_map_is_refused_by_name() {
        let mut bytes = image(&[&[(1, 0x10000), (2, 2), (4, u64::from(PE_PRESENT))]]);
        let e = Pagemap::parse("pagemap-9.img", b"not criu").unwrap_err();
        assert!(e.to_string().contains("pagemap-9.img"), "{e}");
        assert!(e.to_string().contains("magic"), "{e}");
        bytes.truncate(bytes.len() - 2);
        assert!(Pagemap::parse("p", &bytes)
            .unwrap_err()
            .to_string()
            .contains("past the end"));
        let unaligned = image(&[&[(1, 0x10001), (2, 1), (4, u64::from(PE_PRESENT))]]);
        assert!(Pagemap::parse("p", &unaligned).is_err());
        let no_head = [COMMON_MAGIC.to_le_bytes(), PAGEMAP_MAGIC.to_le_bytes()].concat();
        assert!(Pagemap::parse("p", &no_head)
            .unwrap_err()
            .to_string()
            .contains("no head"));
    }

    #[test]
    fn faults_are_read_from_the_lazy_pages_log_in_order() {
        let log = "(00.200465) uffd: 1-12: #PF at 0x7f844d9ca000\n\
                   (00.200470) pr1-1 Read 7f844d9ca000 1 pages\n\
                   (00.200589) uffd: 1-12: uffd_copy: 0x7f844d9ca000/4096\n\
                   (00.203714) uffd: 27-14: #PF at 0x7fff0aa78000\n\
                   (00.203715) uffd: 1-12: #PF at 0xnothex\n";
        assert_eq!(
            faults(log),
            vec![(1, 0x7f84_4d9c_a000), (27, 0x7fff_0aa7_8000)]
        );
    }
}
