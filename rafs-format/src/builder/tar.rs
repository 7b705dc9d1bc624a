//! A streaming reader of tar archives as OCI layers use them: ustar, GNU (long names,
//! base-256 numbers) and PAX (records of any bytes, including binary xattr values).
//!
//! Written here rather than taken from the `tar` crate because that crate's PAX parser
//! splits records at newlines, so a binary xattr value containing `\n` (a file
//! capability, say) fails to parse; a layer reader must take any byte sequence the
//! length-prefixed PAX format allows. Every length and count is bounded, and every
//! malformed header is an error naming the field.

use std::collections::HashMap;
use std::io::{self, Read};

pub(crate) const BLOCK: usize = 512;
/// PAX and GNU long-name headers larger than this are refused (they are metadata).
const MAX_META_ENTRY: u64 = 16 << 20;

/// Type of a tar entry, reduced to what an image cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryType {
    Regular,
    Hardlink,
    Symlink,
    Char,
    Block,
    Directory,
    Fifo,
}

/// One member of the archive, with extensions applied.
#[derive(Debug, Clone)]
pub(crate) struct TarEntry {
    pub path: Vec<u8>,
    pub link_name: Vec<u8>,
    pub kind: EntryType,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub size: u64,
    pub mtime: (i64, u32),
    pub dev_major: u32,
    pub dev_minor: u32,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// Parses a numeric header field: octal text (NUL/space terminated) or GNU base-256.
pub(crate) fn parse_number(field: &[u8], name: &str) -> io::Result<u64> {
    if let Some(&first) = field.first() {
        if first & 0x80 != 0 {
            if first == 0xff {
                return Err(bad(format!("{name} is negative")));
            }
            let mut n: u64 = u64::from(first & 0x7f);
            for &b in &field[1..] {
                n = n
                    .checked_mul(256)
                    .and_then(|n| n.checked_add(u64::from(b)))
                    .ok_or_else(|| bad(format!("{name} overflows 64 bits")))?;
            }
            return Ok(n);
        }
    }
    let text: Vec<u8> = field
        .iter()
        .copied()
        .skip_while(|&b| b == b' ')
        .take_while(|&b| b != 0 && b != b' ')
        .collect();
    if text.is_empty() {
        return Ok(0);
    }
    let s = std::str::from_utf8(&text).map_err(|_| bad(format!("{name} is not octal")))?;
    u64::from_str_radix(s, 8).map_err(|_| bad(format!("{name} {s:?} is not octal")))
}

/// A NUL-terminated string field.
fn parse_str(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

/// A header's checksum as the unsigned and as the (historical) signed byte sum, with
/// the checksum field itself counted as spaces. Writers use the unsigned one.
pub(crate) fn header_checksums(h: &[u8; BLOCK]) -> (u64, i64) {
    let field = 148..156;
    let bytes = || {
        h.iter()
            .enumerate()
            .map(|(i, &b)| if field.contains(&i) { b' ' } else { b })
    };
    (
        bytes().map(u64::from).sum(),
        bytes().map(|b| i64::from(b as i8)).sum(),
    )
}

/// Parses PAX records (`"<len> <key>=<value>\n"`), length-prefixed so values may hold
/// any bytes.
pub(crate) fn parse_pax(mut data: &[u8]) -> io::Result<HashMap<String, Vec<u8>>> {
    let mut out = HashMap::new();
    while !data.is_empty() {
        if data.iter().all(|&b| b == 0) {
            break;
        }
        let space = data
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| bad("PAX record without a length"))?;
        let len: usize = std::str::from_utf8(&data[..space])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("PAX record length is not a number"))?;
        if len <= space + 1 || len > data.len() || data[len - 1] != b'\n' {
            return Err(bad(format!(
                "PAX record length {len} does not fit the record"
            )));
        }
        let record = &data[space + 1..len - 1];
        let eq = record
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(|| bad("PAX record without '='"))?;
        let key = std::str::from_utf8(&record[..eq]).map_err(|_| bad("PAX key is not UTF-8"))?;
        out.insert(key.to_string(), record[eq + 1..].to_vec());
        data = &data[len..];
    }
    Ok(out)
}

/// Parses a PAX time (`seconds[.fraction]`, possibly negative) into seconds and ns.
pub(crate) fn parse_pax_time(v: &[u8]) -> Option<(i64, u32)> {
    let s = std::str::from_utf8(v).ok()?;
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    // Digits only: a second sign ("--5") or "+5" is not a time.
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(frac) {
        return None;
    }
    let secs: i64 = whole.parse().ok()?;
    let digits: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
    let nsec: u32 = digits.parse().ok()?;
    Some(match (neg, nsec) {
        (false, n) => (secs, n),
        (true, 0) => (-secs, 0),
        (true, n) => (-secs - 1, 1_000_000_000 - n),
    })
}

/// Reads entries one at a time; the data of the current entry is read through
/// [`TarReader::data`] and whatever is left of it is skipped by the next `next_entry`.
#[derive(Debug)]
pub(crate) struct TarReader<R> {
    inner: R,
    /// Bytes of the current entry's data (plus padding) not yet consumed.
    remaining_data: u64,
    remaining_padding: u64,
    done: bool,
    /// Bytes of the archive consumed so far: after `next_entry`, the offset of the
    /// entry's data in the (uncompressed) archive, which an index of a gzip layer
    /// records to read the file from the middle of the layer.
    offset: u64,
    /// Entries read so far, for error messages.
    pub count: u64,
}

impl<R: Read> TarReader<R> {
    pub fn new(inner: R) -> Self {
        TarReader {
            inner,
            remaining_data: 0,
            remaining_padding: 0,
            done: false,
            offset: 0,
            count: 0,
        }
    }

    /// Offset in the archive of the next byte to be read: the current entry's first
    /// data byte, right after `next_entry`.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    fn skip(&mut self, n: u64) -> io::Result<()> {
        let copied = io::copy(&mut (&mut self.inner).take(n), &mut io::sink())?;
        self.offset += copied;
        if copied != n {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "archive ends inside an entry",
            ));
        }
        Ok(())
    }

    /// Reads a whole block; `Ok(false)` at a clean end of stream.
    fn read_block(&mut self, block: &mut [u8; BLOCK]) -> io::Result<bool> {
        let mut filled = 0;
        while filled < BLOCK {
            let n = self.inner.read(&mut block[filled..])?;
            if n == 0 {
                if filled == 0 {
                    return Ok(false);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "archive ends inside a header",
                ));
            }
            filled += n;
            self.offset += n as u64;
        }
        Ok(true)
    }

    /// The data of the current entry.
    pub fn data(&mut self) -> impl Read + '_ {
        DataReader { tar: self }
    }

    /// Reads the current entry's data whole (for metadata entries, bounded).
    fn read_meta(&mut self, size: u64, what: &str) -> io::Result<Vec<u8>> {
        if size > MAX_META_ENTRY {
            return Err(bad(format!("{what} of {size} bytes is larger than 16 MiB")));
        }
        // Grown as data arrives, so a header claiming 16 MiB costs only what follows it.
        let mut buf = Vec::new();
        self.data().read_to_end(&mut buf)?;
        if buf.len() as u64 != size {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("archive ends inside a {what}"),
            ));
        }
        Ok(buf)
    }

    /// Advances to the next file entry, applying GNU long names and PAX records.
    pub fn next_entry(&mut self) -> io::Result<Option<TarEntry>> {
        let mut long_name: Option<Vec<u8>> = None;
        let mut long_link: Option<Vec<u8>> = None;
        let mut pax: HashMap<String, Vec<u8>> = HashMap::new();
        loop {
            let left = self.remaining_data.saturating_add(self.remaining_padding);
            self.skip(left)?;
            self.remaining_data = 0;
            self.remaining_padding = 0;
            if self.done {
                return Ok(None);
            }
            let mut h = [0u8; BLOCK];
            if !self.read_block(&mut h)? || h.iter().all(|&b| b == 0) {
                // End of archive (one or two zero blocks, or a stream that just stops).
                self.done = true;
                if long_name.is_some() || long_link.is_some() || !pax.is_empty() {
                    return Err(bad("archive ends after an extended header with no entry"));
                }
                return Ok(None);
            }
            let stored = parse_number(&h[148..156], "checksum")?;
            let (unsigned, signed) = header_checksums(&h);
            if stored != unsigned && stored as i64 != signed {
                return Err(bad(format!(
                    "header checksum {stored} does not match the header ({unsigned})"
                )));
            }
            self.count += 1;
            let typeflag = h[156];
            let size = parse_number(&h[124..136], "size")?;
            let pax_size = pax.get("size").map(|v| {
                std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| bad("PAX size is not a number"))
            });
            let size = match (typeflag, pax_size) {
                (b'x' | b'g' | b'L' | b'K', _) | (_, None) => size,
                (_, Some(s)) => s?,
            };
            self.remaining_data = size;
            self.remaining_padding = (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64;
            match typeflag {
                b'x' => {
                    let data = self.read_meta(size, "PAX header")?;
                    pax.extend(parse_pax(&data)?);
                    continue;
                }
                b'g' => {
                    // Global records (comments, defaults) do not describe files here.
                    self.read_meta(size, "PAX global header")?;
                    continue;
                }
                b'L' => {
                    long_name = Some(parse_str(&self.read_meta(size, "GNU long name")?).to_vec());
                    continue;
                }
                b'K' => {
                    long_link =
                        Some(parse_str(&self.read_meta(size, "GNU long link name")?).to_vec());
                    continue;
                }
                _ => {}
            }
            let kind = match typeflag {
                b'0' | 0 | b'7' => EntryType::Regular,
                b'1' => EntryType::Hardlink,
                b'2' => EntryType::Symlink,
                b'3' => EntryType::Char,
                b'4' => EntryType::Block,
                b'5' => EntryType::Directory,
                b'6' => EntryType::Fifo,
                b'S' => return Err(bad(
                    "GNU sparse entries are not supported; re-create the layer without --sparse",
                )),
                other => return Err(bad(format!("unsupported entry type {:?}", other as char))),
            };
            if pax.keys().any(|k| k.starts_with("GNU.sparse.")) {
                return Err(bad(
                    "PAX sparse entries are not supported; re-create the layer without --sparse",
                ));
            }
            let is_ustar = &h[257..263] == b"ustar\0";
            let mut path = match (pax.remove("path"), long_name.take()) {
                (Some(p), _) => p,
                (None, Some(p)) => p,
                (None, None) => {
                    let name = parse_str(&h[0..100]);
                    let prefix = if is_ustar {
                        parse_str(&h[345..500])
                    } else {
                        &[]
                    };
                    if prefix.is_empty() {
                        name.to_vec()
                    } else {
                        [prefix, b"/", name].concat()
                    }
                }
            };
            // Old tars mark directories only by a trailing slash.
            let kind = if kind == EntryType::Regular && path.ends_with(b"/") {
                EntryType::Directory
            } else {
                kind
            };
            while path.len() > 1 && path.ends_with(b"/") {
                path.pop();
            }
            let link_name = match (pax.remove("linkpath"), long_link.take()) {
                (Some(p), _) | (None, Some(p)) => p,
                (None, None) => parse_str(&h[157..257]).to_vec(),
            };
            let num = |key: &str, field: &[u8]| -> io::Result<u64> {
                match pax.get(key) {
                    Some(v) => std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| bad(format!("PAX {key} is not a number"))),
                    None => parse_number(field, key),
                }
            };
            let mtime = match pax.get("mtime") {
                Some(v) => parse_pax_time(v).ok_or_else(|| bad("PAX mtime is not a time"))?,
                None => (
                    parse_number(&h[136..148], "mtime")?.min(i64::MAX as u64) as i64,
                    0,
                ),
            };
            let dev = |field: &[u8], name| -> io::Result<u32> {
                u32::try_from(parse_number(field, name)?)
                    .map_err(|_| bad(format!("{name} does not fit 32 bits")))
            };
            let mut xattrs: Vec<(Vec<u8>, Vec<u8>)> = pax
                .iter()
                .filter_map(|(k, v)| {
                    k.strip_prefix("SCHILY.xattr.")
                        .map(|n| (n.as_bytes().to_vec(), v.clone()))
                })
                .collect();
            xattrs.sort();
            let entry = TarEntry {
                path,
                link_name,
                kind,
                mode: (parse_number(&h[100..108], "mode")? & 0o7777) as u32,
                uid: num("uid", &h[108..116])?,
                gid: num("gid", &h[116..124])?,
                size: if matches!(kind, EntryType::Regular) {
                    size
                } else {
                    0
                },
                mtime,
                dev_major: if is_ustar || &h[257..263] == b"ustar " {
                    dev(&h[329..337], "devmajor")?
                } else {
                    0
                },
                dev_minor: if is_ustar || &h[257..263] == b"ustar " {
                    dev(&h[337..345], "devminor")?
                } else {
                    0
                },
                xattrs,
            };
            if !matches!(kind, EntryType::Regular) {
                // Data of non-files (rare, but allowed) is skipped with the padding.
                self.remaining_data = size;
            }
            return Ok(Some(entry));
        }
    }
}

/// Reader over the current entry's data.
struct DataReader<'a, R> {
    tar: &'a mut TarReader<R>,
}

impl<R: Read> Read for DataReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (buf.len() as u64).min(self.tar.remaining_data) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = self.tar.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "archive ends inside file data",
            ));
        }
        self.tar.remaining_data -= n as u64;
        self.tar.offset += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_values_may_hold_newlines() {
        let value = b"a\nb=c";
        let key = "SCHILY.xattr.security.capability";
        let body_len = key.len() + 1 + value.len() + 1;
        let mut len = body_len + 1;
        while len.to_string().len() + body_len + 1 != len {
            len = len.to_string().len() + body_len + 1;
        }
        let mut rec = format!("{len} {key}=").into_bytes();
        rec.extend_from_slice(value);
        rec.push(b'\n');
        rec.extend_from_slice(b"30 mtime=1700000000.000000001\n");
        let m = parse_pax(&rec).unwrap();
        assert_eq!(m[key], value);
        assert_eq!(parse_pax_time(&m["mtime"]), Some((1_700_000_000, 1)));
    }

    #[test]
    fn bad_pax_lengths_are_errors() {
        assert!(parse_pax(b"99 path=x\n").is_err());
        assert!(parse_pax(b"3 p\n").is_err());
        assert!(parse_pax(b"x path=y\n").is_err());
    }

    #[test]
    fn numbers_octal_and_base256() {
        assert_eq!(parse_number(b"0000644\0", "mode").unwrap(), 0o644);
        assert_eq!(parse_number(b"  755 \0", "mode").unwrap(), 0o755);
        assert_eq!(
            parse_number(&[0x80, 0, 0, 0, 0, 0, 1, 0], "uid").unwrap(),
            256
        );
        assert!(parse_number(b"99\0", "mode").is_err());
    }

    #[test]
    fn pax_times_keep_nanoseconds() {
        assert_eq!(
            parse_pax_time(b"1700000000.123456789"),
            Some((1700000000, 123456789))
        );
        assert_eq!(
            parse_pax_time(b"1700000000.5"),
            Some((1700000000, 500000000))
        );
        assert_eq!(parse_pax_time(b"1700000000"), Some((1700000000, 0)));
        assert_eq!(parse_pax_time(b"-1.25"), Some((-2, 750000000)));
        assert_eq!(parse_pax_time(b"abc"), None);
        assert_eq!(parse_pax_time(b"1.2x"), None);
        assert_eq!(parse_pax_time(b"--5"), None);
        assert_eq!(parse_pax_time(b"-9223372036854775808"), None);
        assert_eq!(parse_pax_time(b"-"), None);
    }

    #[test]
    fn truncated_archives_are_errors() {
        let mut b = ::tar::Builder::new(Vec::new());
        let mut h = ::tar::Header::new_ustar();
        h.set_size(1000);
        h.set_mode(0o644);
        h.set_entry_type(::tar::EntryType::Regular);
        b.append_data(&mut h, "f", &[7u8; 1000][..]).unwrap();
        let bytes = b.into_inner().unwrap();
        for cut in [100, 600, 1200] {
            let mut r = TarReader::new(&bytes[..cut]);
            let res = r.next_entry().and_then(|e| {
                let mut v = Vec::new();
                if e.is_some() {
                    r.data().read_to_end(&mut v)?;
                }
                r.next_entry()
            });
            assert!(res.is_err(), "cut at {cut}");
        }
    }
}
