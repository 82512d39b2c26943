//! A private CSV file, normalised record by record before DataFusion's CSV reader sees it
//! (round 47, review "readers" F2 (b)). arrow-csv fails a whole batch for a record whose number
//! of fields differs from the table's, and for a byte that is not UTF-8 anywhere in a batch:
//! whether a read succeeds would depend on one row. [`Normaliser`] splits the file into records
//! with csv_core configured as arrow-csv configures it (the owner's delimiter, quote, escape and
//! comment; `\r`, `\n` or `\r\n` ends a record; a doubled quote is a quote), and writes:
//!
//! - a record of exactly the table's number of fields, each valid UTF-8: the same fields,
//!   re-encoded in the same dialect (quoted when needed), so arrow-csv reads the same values;
//! - any other record (more or fewer fields, a field that is not UTF-8, a quoted field still
//!   open at the end of the file): as many empty fields as the table has columns, a row of
//!   NULLs. The row stays, so a count over a `replace` neighbour is unchanged.
//!
//! Comment lines and blank lines are dropped (arrow-csv skips them too). The number of fields
//! is the pinned schema's; at the first registration (nothing pinned yet) it is the first
//! record's (the header's, when there is one), as schema inference takes it.
//!
//! A field whose text (its bytes once unquoted, as [`crate::guard::table::ValueCap`] counts a
//! text value) is over the owner's `max_value_bytes` ([`CsvDialect::max_value_bytes`]) is not
//! kept: its bytes are dropped as they are read (still checked as UTF-8, so its record reads as
//! a row of NULLs exactly when it did), and it is written as a missing value, which reads as
//! the cap made it: empty (NULL, or in a column declared NOT NULL its type's default), or, in a
//! table with a `null_regex` (where an empty text value may read as "" rather than NULL), as
//! `max_value_bytes + 1` bytes of `x`, which reads as NULL or is over the cap again for a text
//! column and converts to no other type. Before (round 51, review "limits" F1), the normaliser
//! held the whole field and arrow-csv copied it again before the cap ran: one 300 MB value, in a
//! column the query did not even read, made the process peak at 1.24 GB, and abort under a
//! memory limit after the charge where the neighbouring file read. So a record's kept fields are
//! at most its number of columns times the cap.
use csv_core::{ReadRecordResult, Reader, ReaderBuilder};

/// How a private CSV table's files are split into records, and its number of columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsvDialect {
    pub delimiter: u8,
    pub quote: u8,
    pub escape: Option<u8>,
    pub comment: Option<u8>,
    /// The table's number of columns (None: the first record's).
    pub columns: Option<usize>,
    /// The owner's `max_value_bytes` (round 51): a field whose text is longer is not kept and
    /// reads as a missing value (the module documentation). None: no bound.
    pub max_value_bytes: Option<usize>,
    /// Whether an empty field reads as NULL (the table has no `null_regex`): a field over
    /// `max_value_bytes` is then written empty, else as `max_value_bytes + 1` bytes of `x`.
    pub empty_is_null: bool,
}

impl CsvDialect {
    /// This dialect with fields bounded by the owner's `max_value_bytes` (round 51).
    pub fn with_max_value_bytes(mut self, bytes: usize) -> Self {
        self.max_value_bytes = Some(bytes);
        self
    }

    /// The record splitter arrow-csv builds for this dialect (`Format::build_parser`).
    fn reader(&self) -> Reader {
        ReaderBuilder::new()
            .delimiter(self.delimiter)
            .quote(self.quote)
            .escape(self.escape)
            .comment(self.comment)
            .build()
    }
}

/// Normalises a CSV byte stream record by record (see the module documentation): feed it the
/// file's bytes in pieces ([`Normaliser::feed`], [`Normaliser::feed_until`]), then
/// [`Normaliser::finish`].
///
/// Its memory is the current record's fields (a record of the table's width needs them to be
/// checked and re-encoded) and their ends, nothing else in proportion to a record: a record
/// already wider than the table's is discarded as it is read, in the buffers it has, and the
/// end of the file is found with the same reader, not by reading the record again (round 47,
/// review "fix-readers" F2). A field over `max_value_bytes` is dropped as it is read (round 51),
/// so the fields kept are at most the table's number of columns times the cap, and the buffer,
/// grown by doubling, at most about twice that (a record of many fields each under the cap is
/// bounded by the same product: one field more than the table has makes it a row of NULLs).
#[derive(Debug)]
pub struct Normaliser {
    dialect: CsvDialect,
    reader: Reader,
    /// The current record's fields (csv_core's output, but for the fields over the cap) and
    /// their ends.
    fields: Vec<u8>,
    ends: Vec<usize>,
    nout: usize,
    nend: usize,
    /// The current record has more fields than the table: a row of NULLs, its fields and
    /// ends no longer kept.
    wide: bool,
    /// The bytes of the current record that csv_core wrote and that were dropped (fields over
    /// the cap): the ends it reports count them.
    dropped: usize,
    /// The current record's fields over the cap, in order (written as missing values).
    over: Vec<usize>,
    /// The field being read is over the cap: its bytes are checked (`utf8`) and dropped as
    /// they come.
    open_over: bool,
    utf8: Utf8Check,
    /// A field over the cap is not UTF-8: its record reads as a row of NULLs, as before.
    not_utf8: bool,
}

/// The least room a field over the cap is read into (a record's earlier fields can leave little
/// of the buffer): bounded calls of csv_core, not one per few bytes (round 51).
const ROOM: usize = 16 << 10;

impl Normaliser {
    pub fn new(dialect: CsvDialect) -> Self {
        Self {
            reader: dialect.reader(),
            dialect,
            fields: vec![0; 4096],
            ends: vec![0; 64],
            nout: 0,
            nend: 0,
            wide: false,
            dropped: 0,
            over: vec![],
            open_over: false,
            utf8: Utf8Check::default(),
            not_utf8: false,
        }
    }

    /// Reads `input` (the next bytes of the file), appending the normalised records it
    /// completes to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        self.feed_until(input, out, usize::MAX);
    }

    /// As [`Normaliser::feed`], but stops after the record that brings `out` to `limit` bytes or
    /// more (a short malformed line becomes a row of the table's width: the output of a piece
    /// can be many times its input). Returns how many bytes of `input` it read; the caller feeds
    /// the rest next.
    pub fn feed_until(&mut self, input: &[u8], out: &mut Vec<u8>, limit: usize) -> usize {
        let mut read = 0;
        // An empty input would tell csv_core the file ended.
        while read < input.len() {
            let (res, nin) = self.read(&input[read..]);
            read += nin;
            match res {
                ReadRecordResult::InputEmpty | ReadRecordResult::End => break,
                ReadRecordResult::OutputFull => self.full(false),
                ReadRecordResult::OutputEndsFull => self.full(true),
                ReadRecordResult::Record => {
                    self.record(true, out);
                    if out.len() >= limit {
                        break;
                    }
                }
            }
        }
        read
    }

    /// Ends the file: the last record, if it has no line end, is written too (as a row of
    /// NULLs if a quoted field is still open). A line end is read first: it ends the record
    /// unless a quoted field is open, where it is part of the value and the record ends only
    /// with the file (so the reader itself tells the two apart, without the record's bytes
    /// being kept or read again; round 47, review "fix-readers" F2). A last line that is a
    /// comment without a line end is dropped as a comment (csv_core alone would end the file
    /// with a record of one empty field).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let mut input: &[u8] = b"\n";
        loop {
            let ended = input.is_empty();
            let (res, nin) = self.read(input);
            input = &input[nin..];
            match res {
                ReadRecordResult::OutputFull => self.full(false),
                ReadRecordResult::OutputEndsFull => self.full(true),
                // Ended by a line end (ours or the file's): complete; by the end of the file
                // only: a quoted field left open.
                ReadRecordResult::Record => self.record(!ended, out),
                ReadRecordResult::InputEmpty if !ended => {}
                ReadRecordResult::InputEmpty | ReadRecordResult::End => return,
            }
        }
    }

    /// One call of csv_core on `input` (empty: the end of the file), into the room the buffers
    /// have; each field it ends is checked against the cap ([`Normaliser::ended`]). Returns its
    /// result and how many bytes of `input` it read.
    fn read(&mut self, input: &[u8]) -> (ReadRecordResult, usize) {
        let (res, nin, nout, nend) = self.reader.read_record(
            input,
            &mut self.fields[self.nout..],
            &mut self.ends[self.nend..],
        );
        let first = self.nend;
        self.nout += nout;
        self.nend += nend;
        if !self.wide {
            for k in first..self.nend {
                self.ended(k);
            }
        }
        (res, nin)
    }

    /// Field `k` of the current record just ended: its end is made one in the bytes kept, and
    /// a field over the cap (dropped in part already, or longer than the cap whole) is checked
    /// as UTF-8 and dropped, its end its start (round 51).
    fn ended(&mut self, k: usize) {
        // csv_core counts every byte it wrote for the record, the dropped ones too.
        let end = self.ends[k] - self.dropped;
        self.ends[k] = end;
        let Some(cap) = self.dialect.max_value_bytes else {
            return;
        };
        let start = if k == 0 { 0 } else { self.ends[k - 1] };
        if !self.open_over && end - start <= cap {
            return;
        }
        if !self.utf8.feed(&self.fields[start..end]) || !self.utf8.complete() {
            self.not_utf8 = true;
        }
        self.utf8 = Utf8Check::default();
        self.open_over = false;
        // The fields csv_core wrote after it, in the same call, move down.
        self.fields.copy_within(end..self.nout, start);
        self.nout -= end - start;
        self.dropped += end - start;
        self.ends[k] = start;
        self.over.push(k);
    }

    /// csv_core filled the fields (`ends`: false) or the ends buffer: a record already wider
    /// than the table's reads as a row of NULLs, so what it wrote is dropped and the buffers
    /// are reused; a field being read that is over the cap is checked and dropped so far, and
    /// the buffer reused (round 51); else the buffer grows (by doubling: a record of the
    /// table's width needs its fields whole).
    fn full(&mut self, ends: bool) {
        if let Some(columns) = self.dialect.columns
            && (self.wide || self.nend > columns)
        {
            self.wide = true;
            self.nout = 0;
            self.nend = 0;
            return;
        }
        if !ends && let Some(cap) = self.dialect.max_value_bytes {
            let start = if self.nend == 0 {
                0
            } else {
                self.ends[self.nend - 1]
            };
            if self.open_over || self.nout - start > cap {
                self.open_over = true;
                if !self.utf8.feed(&self.fields[start..self.nout]) {
                    self.not_utf8 = true;
                }
                self.dropped += self.nout - start;
                self.nout = start;
                if self.fields.len() - self.nout >= cap.min(ROOM) {
                    return;
                }
            }
        }
        if ends {
            let n = self.ends.len();
            self.ends.resize(n * 2, 0);
        } else {
            let n = self.fields.len();
            self.fields.resize(n * 2, 0);
        }
    }

    /// Writes the record just read (`ok`: complete) and starts the next.
    fn record(&mut self, ok: bool, out: &mut Vec<u8>) {
        let got = self.nend;
        let columns = *self.dialect.columns.get_or_insert(got);
        let mut start = 0;
        let mut valid = ok && !self.wide && !self.not_utf8 && got == columns;
        if valid {
            for &end in &self.ends[..got] {
                if std::str::from_utf8(&self.fields[start..end]).is_err() {
                    valid = false;
                    break;
                }
                start = end;
            }
        }
        start = 0;
        let mut over = self.over.iter().peekable();
        for i in 0..columns {
            if i > 0 {
                out.push(self.dialect.delimiter);
            }
            let field: &[u8] = if valid {
                let end = self.ends[i];
                let f = &self.fields[start..end];
                start = end;
                f
            } else {
                &[]
            };
            let missing = valid && over.next_if_eq(&&i).is_some();
            match self.dialect.max_value_bytes {
                // Under a null_regex an empty text value may read as "", not NULL: a value
                // over the cap again (or one the regex makes NULL), and no other type's value.
                Some(cap) if missing && !self.dialect.empty_is_null => {
                    self.write_field(&vec![b'x'; cap + 1], i == 0 && columns == 1, i == 0, out)
                }
                _ => self.write_field(field, i == 0 && columns == 1, i == 0, out),
            }
        }
        out.push(b'\n');
        self.nout = 0;
        self.nend = 0;
        self.wide = false;
        self.dropped = 0;
        self.over.clear();
        self.open_over = false;
        self.utf8 = Utf8Check::default();
        self.not_utf8 = false;
    }

    /// Writes one field so that the dialect's reader gives it back: quoted when it holds the
    /// delimiter, the quote, the escape or a line end, when it is the first field and starts
    /// with the comment character, or when it is a record's only field and empty (an empty line
    /// would be skipped); inside quotes the quote is doubled and the escape escaped.
    fn write_field(&self, field: &[u8], only: bool, first: bool, out: &mut Vec<u8>) {
        let d = &self.dialect;
        let special = |b: &u8| {
            *b == d.delimiter || *b == d.quote || *b == b'\r' || *b == b'\n' || Some(*b) == d.escape
        };
        let quoted = field.iter().any(special)
            || (first && d.comment.is_some() && field.first() == d.comment.as_ref())
            || (only && field.is_empty());
        if !quoted {
            out.extend_from_slice(field);
            return;
        }
        out.push(d.quote);
        for &b in field {
            if b == d.quote {
                out.push(d.quote);
            } else if Some(b) == d.escape {
                out.push(b);
            }
            out.push(b);
        }
        out.push(d.quote);
    }
}

/// Whether a field read in pieces is UTF-8, keeping only the (at most 3) bytes of a character
/// a piece ends inside (a field over the cap is checked as it is dropped; round 51).
#[derive(Debug, Default)]
struct Utf8Check {
    tail: [u8; 4],
    n: usize,
}

impl Utf8Check {
    /// Checks the next piece: false if the field is not UTF-8 (whatever follows).
    fn feed(&mut self, mut piece: &[u8]) -> bool {
        // A character begun in the last piece, completed byte by byte.
        while self.n > 0 && !piece.is_empty() {
            self.tail[self.n] = piece[0];
            self.n += 1;
            piece = &piece[1..];
            match std::str::from_utf8(&self.tail[..self.n]) {
                Ok(_) => self.n = 0,
                Err(e) if e.error_len().is_none() => {}
                Err(_) => {
                    self.n = 0;
                    return false;
                }
            }
        }
        match std::str::from_utf8(piece) {
            Ok(_) => true,
            Err(e) if e.error_len().is_none() => {
                let rest = &piece[e.valid_up_to()..];
                self.tail[..rest.len()].copy_from_slice(rest);
                self.n = rest.len();
                true
            }
            Err(_) => false,
        }
    }

    /// The field ended on a whole character.
    fn complete(&self) -> bool {
        self.n == 0
    }
}

/// The number of fields of the first record `read` gives in `dialect` (a CSV file's header;
/// comment and blank lines skipped as arrow-csv skips them), read with fixed buffers whatever
/// the record's size; None for a file without a record. The owner's registration compares it
/// with the table's width (round 47, review "fix-readers" F3: [`crate::owner::check_csv_widths`]).
pub fn first_record_width(
    dialect: &CsvDialect,
    mut read: impl std::io::Read,
) -> std::io::Result<Option<usize>> {
    let mut r = dialect.reader();
    let mut buf = vec![0u8; 64 << 10];
    let mut fields = vec![0u8; 64 << 10];
    let mut ends = vec![0usize; 256];
    let (mut lo, mut hi, mut ended, mut width) = (0, 0, false, 0);
    loop {
        if lo == hi && !ended {
            hi = match read.read(&mut buf) {
                Ok(k) => k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            lo = 0;
            if hi == 0 {
                // A line end before the end, as the normaliser reads one (`finish`).
                (buf[0], hi, ended) = (b'\n', 1, true);
            }
        }
        // Once the input is empty, csv_core reads it as the end of the file.
        let (res, nin, _, nend) = r.read_record(&buf[lo..hi], &mut fields, &mut ends);
        lo += nin;
        width += nend;
        match res {
            ReadRecordResult::Record => return Ok(Some(width)),
            ReadRecordResult::End => return Ok(None),
            ReadRecordResult::InputEmpty if ended && lo == hi && nin == 0 => return Ok(None),
            ReadRecordResult::InputEmpty
            | ReadRecordResult::OutputFull
            | ReadRecordResult::OutputEndsFull => {}
        }
    }
}

/// `input` normalised whole (tests, and small files).
pub fn normalise(input: &[u8], dialect: CsvDialect) -> Vec<u8> {
    let mut n = Normaliser::new(dialect);
    let mut out = Vec::with_capacity(input.len() + 16);
    n.feed(input, &mut out);
    n.finish(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dialect(columns: Option<usize>) -> CsvDialect {
        CsvDialect {
            delimiter: b',',
            quote: b'"',
            escape: None,
            comment: None,
            columns,
            max_value_bytes: None,
            empty_is_null: true,
        }
    }

    fn norm(input: &str, d: CsvDialect) -> String {
        String::from_utf8(normalise(input.as_bytes(), d)).unwrap()
    }

    /// The records arrow's splitter (the same csv_core configuration) reads from `bytes`.
    fn records(bytes: &[u8], d: CsvDialect) -> Vec<Vec<Vec<u8>>> {
        let mut r = d.reader();
        let mut input = bytes;
        let mut out = vec![];
        let mut fields = vec![0u8; bytes.len() + 16];
        let mut ends = vec![0usize; bytes.len() + 16];
        loop {
            // Once `input` is empty, the call tells csv_core the input ended.
            let (res, nin, _, nend) = r.read_record(input, &mut fields, &mut ends);
            input = &input[nin..];
            match res {
                ReadRecordResult::Record => {
                    let mut start = 0;
                    let mut record = vec![];
                    for &e in &ends[..nend] {
                        record.push(fields[start..e].to_vec());
                        start = e;
                    }
                    out.push(record);
                }
                ReadRecordResult::End => return out,
                ReadRecordResult::InputEmpty => {}
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn records_of_the_right_width_keep_their_values() {
        let d = dialect(Some(2));
        assert_eq!(norm("g,v\na,1\nb,2\n", d), "g,v\na,1\nb,2\n");
        // Quotes, a delimiter, a quote and line ends inside a value; CRLF line ends.
        let input = "g,v\r\n\"a,b\",\"say \"\"hi\"\"\"\r\nc,\"x\ny\"\r\n";
        let out = normalise(input.as_bytes(), d);
        assert_eq!(
            records(&out, d),
            records(input.as_bytes(), d),
            "{}",
            String::from_utf8_lossy(&out)
        );
        assert_eq!(records(&out, d)[2][1], b"x\ny");
    }

    #[test]
    fn records_of_another_width_read_as_a_row_of_nulls() {
        let d = dialect(Some(2));
        assert_eq!(norm("g,v\na,1,2\nb\nc,3\n", d), "g,v\n,\n,\nc,3\n");
        // One column: an empty row is quoted, or it would be a blank line.
        let d1 = dialect(Some(1));
        assert_eq!(norm("x\n1\n1,2\n", d1), "x\n1\n\"\"\n");
        assert_eq!(records(b"x\n1\n\"\"\n", d1).len(), 3);
    }

    #[test]
    fn the_width_is_the_first_records_when_nothing_is_pinned() {
        assert_eq!(
            norm("a,b,c\n1,2,3\n1,2\n", dialect(None)),
            "a,b,c\n1,2,3\n,,\n"
        );
        // Pinned: a header of another width is a row of NULLs too (its names are not read).
        assert_eq!(norm("a,b,c\n1,2\n", dialect(Some(2))), ",\n1,2\n");
    }

    #[test]
    fn a_field_that_is_not_utf8_makes_its_record_a_row_of_nulls() {
        let d = dialect(Some(2));
        let out = normalise(b"g,v\na,\xff\xfe\nb,\"ok\"\n", d);
        assert_eq!(out, b"g,v\n,\nb,ok\n");
        let out = normalise(b"g,v\n\"\xc3\",1\n", d);
        assert_eq!(out, b"g,v\n,\n");
    }

    #[test]
    fn escapes_and_comments_are_the_dialects() {
        let d = CsvDialect {
            delimiter: b';',
            quote: b'\'',
            escape: Some(b'\\'),
            comment: Some(b'#'),
            columns: Some(2),
            ..dialect(None)
        };
        let input = "# a comment, with; fields\ng;v\n'a\\'b';'c\\\\d'\n'#x';1\n#c;d;e\n";
        let out = normalise(input.as_bytes(), d);
        let got = records(&out, d);
        assert_eq!(
            got,
            records(input.as_bytes(), d),
            "{}",
            String::from_utf8_lossy(&out)
        );
        assert_eq!(got.len(), 3, "the comment lines are dropped");
        assert_eq!(got[1], vec![b"a'b".to_vec(), b"c\\d".to_vec()]);
        assert_eq!(
            got[2][0], b"#x",
            "a value starting with the comment character stays"
        );
    }

    #[test]
    fn the_last_record_without_a_line_end_and_an_open_quote() {
        let d = dialect(Some(2));
        assert_eq!(norm("g,v\na,1", d), "g,v\na,1\n");
        assert_eq!(norm("g,v\na,\"1", d), "g,v\n,\n");
        assert_eq!(norm("g,v\na,\"1\nb,2\n", d), "g,v\n,\n", "open to the end");
        assert_eq!(norm("g,v\na,\"1\"", d), "g,v\na,1\n");
        assert_eq!(norm("", d), "");
        assert_eq!(norm("\n\n", d), "");
    }

    /// Any bytes: every record of the output has the table's width and is UTF-8, the output has
    /// as many records as the input, and each record that had the width and was UTF-8 is kept.
    #[test]
    fn any_input_gives_records_of_the_tables_width() {
        let alphabet = b"ab,;\"'\n\r\\#\xff ";
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..3000 {
            let d = CsvDialect {
                delimiter: [b',', b';'][round % 2],
                quote: [b'"', b'\''][round / 2 % 2],
                escape: [None, Some(b'\\')][round / 4 % 2],
                comment: [None, Some(b'#')][round / 8 % 2],
                columns: Some(1 + round % 3),
                ..dialect(None)
            };
            let len = (next() % 40) as usize;
            let input: Vec<u8> = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            let out = normalise(&input, d);
            // With a line end added: a last line that is a comment without one is a comment
            // (csv_core alone reads it as a record of one empty field; round 47).
            let ended = [&input[..], b"\n"].concat();
            let (before, after) = (records(&ended, d), records(&out, d));
            assert_eq!(before.len(), after.len(), "{input:?} -> {out:?}");
            for (b, a) in before.iter().zip(&after) {
                assert_eq!(a.len(), d.columns.unwrap(), "{input:?} -> {out:?}");
                assert!(a.iter().all(|f| std::str::from_utf8(f).is_ok()));
                let kept = b.len() == a.len() && b.iter().all(|f| std::str::from_utf8(f).is_ok());
                if kept && b != a {
                    // Only a last record whose quote was left open differs.
                    assert!(a.iter().all(|f| f.is_empty()), "{input:?} -> {out:?}");
                }
            }
        }
    }

    /// Round 47 (review "fix-readers" F2): a last record of 4 MiB without a line end costs its
    /// fields (at most twice its size, by doubling) and a fixed ends buffer, not a copy and a
    /// re-read (before: about 10 bytes per byte); a record wider than the table's keeps fixed
    /// buffers whatever its size.
    #[test]
    fn a_huge_last_record_is_normalised_in_bounded_memory() {
        let d = dialect(Some(2));
        let big = 4 << 20;
        let mut input = b"g,v\na,".to_vec();
        input.resize(input.len() + big, b'x');
        for (piece, open) in [(64 << 10, false), (1 << 20, true)] {
            let mut input = input.clone();
            if open {
                input.insert(6, b'"');
            }
            let mut n = Normaliser::new(d);
            let mut out = vec![];
            for chunk in input.chunks(piece) {
                n.feed(chunk, &mut out);
            }
            n.finish(&mut out);
            assert!(
                n.fields.capacity() <= 2 * big + 4096,
                "{}",
                n.fields.capacity()
            );
            assert_eq!(n.ends.capacity(), 64);
            if open {
                assert_eq!(out, b"g,v\n,\n", "a quoted field left open");
            } else {
                assert_eq!(out.len(), 4 + 2 + big + 1);
                assert_eq!(&out[out.len() - 2..], b"x\n");
            }
        }
        // 2 M fields against a table of 2: fixed buffers, a row of NULLs.
        let wide = "a,".repeat(1 << 20) + "a\n";
        let mut n = Normaliser::new(d);
        let mut out = vec![];
        n.feed(b"g,v\n", &mut out);
        n.feed(wide.as_bytes(), &mut out);
        n.finish(&mut out);
        assert_eq!(out, b"g,v\n,\n");
        assert_eq!((n.fields.capacity(), n.ends.capacity()), (4096, 64));
    }

    /// Round 47 (review "fix-readers" F2): a piece of short malformed lines under a wide table
    /// gives its output in bounded chunks (`feed_until`), and the chunks together are the
    /// whole normalised file.
    #[test]
    fn the_output_is_given_in_bounded_chunks() {
        let d = dialect(Some(1000));
        let input = "x\n".repeat(1 << 14);
        let limit = 64 << 10;
        let mut n = Normaliser::new(d);
        let (mut all, mut rest, mut chunks) = (vec![], input.as_bytes(), 0);
        while !rest.is_empty() {
            let mut out = vec![];
            let read = n.feed_until(rest, &mut out, limit);
            assert!(out.len() < limit + 1000, "{}", out.len());
            rest = &rest[read..];
            all.extend_from_slice(&out);
            chunks += 1;
        }
        n.finish(&mut all);
        assert!(chunks > 200, "{chunks}");
        assert_eq!(all, normalise(input.as_bytes(), d));
        assert_eq!(all.len(), (1 << 14) * 1000);
    }

    /// Round 47 (review "fix-readers" F3): the first record's width, past comment and blank
    /// lines, across reads and whatever its size.
    #[test]
    fn the_first_records_width() {
        let d = CsvDialect {
            comment: Some(b'#'),
            ..dialect(None)
        };
        let width = |b: &[u8]| first_record_width(&d, b).unwrap();
        assert_eq!(width(b"a,b,c\n1,2\n"), Some(3));
        assert_eq!(width(b"# note, with, commas\n\n\"a,b\",c"), Some(2));
        assert_eq!(width(b""), None);
        assert_eq!(width(b"\n#x\n"), None);
        assert_eq!(width(b"#x"), None);
        assert_eq!(width(b"a,\"b"), Some(2), "a quote open to the end");
        let wide = "ab,".repeat(100_000) + "z\n";
        assert_eq!(width(wide.as_bytes()), Some(100_001));
    }

    #[test]
    fn feeding_in_pieces_gives_the_same_bytes() {
        let d = dialect(Some(3));
        let mut input = String::from("a,b,c\n");
        for i in 0..500 {
            input.push_str(&format!("{i},\"x\ny,{i}\",z\r\n"));
            if i % 7 == 0 {
                input.push_str("bad,row\n");
            }
        }
        let whole = normalise(input.as_bytes(), d);
        for piece in [1, 2, 3, 5, 64, 4097] {
            let mut n = Normaliser::new(d);
            let mut out = vec![];
            for chunk in input.as_bytes().chunks(piece) {
                n.feed(chunk, &mut out);
            }
            n.finish(&mut out);
            assert_eq!(out, whole, "{piece}");
        }
        assert_eq!(records(&whole, d).len(), 501 + 72);
    }

    /// `input` normalised in `d`, fed in pieces of `piece` bytes into a normaliser whose field
    /// buffer starts at `room` bytes (so that a field over the cap is dropped while it is read,
    /// not only once it ends).
    fn pieces(input: &[u8], d: CsvDialect, piece: usize, room: usize) -> Vec<u8> {
        let mut n = Normaliser::new(d);
        n.fields = vec![0; room];
        let mut out = vec![];
        for chunk in input.chunks(piece.max(1)) {
            n.feed(chunk, &mut out);
        }
        n.finish(&mut out);
        out
    }

    /// The records of `uncapped` (a normaliser's output without the cap) as the cap of
    /// `d` makes them: each field over it missing (empty, or `cap + 1` bytes of `x`).
    fn capped(uncapped: &[u8], d: CsvDialect) -> Vec<Vec<Vec<u8>>> {
        let cap = d.max_value_bytes.unwrap();
        let mut r = records(uncapped, d);
        for f in r.iter_mut().flatten() {
            if f.len() > cap {
                *f = if d.empty_is_null {
                    vec![]
                } else {
                    vec![b'x'; cap + 1]
                };
            }
        }
        r
    }

    /// Round 51 (review "limits" F1): a field over `max_value_bytes` reads as missing, whatever
    /// it holds (quotes, the delimiter, line ends, an escape, CRLF) and however it is fed; the
    /// other fields of its record and every other record read as before.
    #[test]
    fn a_field_over_the_cap_reads_as_missing() {
        // The last value is 9 quotes (each doubled, inside quotes).
        let input = format!(
            "g,v,w\r\n\
             a,\"0123,45\"\"67\r\n89\",short\r\n\
             \"b,\"\"c\",12345678,123456789\r\n\
             \"a very long first field\",x,\"y\nz\"\r\n\
             c,\"\",\"{}\"\r\n",
            "\"\"".repeat(9)
        );
        for empty_is_null in [true, false] {
            let d = CsvDialect {
                max_value_bytes: Some(8),
                empty_is_null,
                ..dialect(Some(3))
            };
            let want = capped(&normalise(input.as_bytes(), dialect(Some(3))), d);
            let missing = if empty_is_null {
                vec![]
            } else {
                b"xxxxxxxxx".to_vec()
            };
            assert_eq!(
                want[1],
                [b"a".to_vec(), missing.clone(), b"short".to_vec()],
                "a quoted value of 14 bytes with a quote, a delimiter and CRLF"
            );
            assert_eq!(
                want[2],
                [b"b,\"c".to_vec(), b"12345678".to_vec(), missing.clone()]
            );
            assert_eq!(want[3], [missing.clone(), b"x".to_vec(), b"y\nz".to_vec()]);
            assert_eq!(
                want[4],
                [b"c".to_vec(), vec![], missing.clone()],
                "9 quotes"
            );
            for piece in [1, 2, 3, 7, 64] {
                for room in [1, 2, 5, 4096] {
                    let out = pieces(input.as_bytes(), d, piece, room);
                    assert_eq!(
                        records(&out, d),
                        want,
                        "{piece} {room}: {}",
                        String::from_utf8_lossy(&out)
                    );
                }
            }
            // The escape and the comment character of another dialect.
            let e = CsvDialect {
                delimiter: b';',
                quote: b'\'',
                escape: Some(b'\\'),
                comment: Some(b'#'),
                ..d
            };
            let input = "#x;y;z\ng;v;w\n'#\\'abcdefgh';'#';'a\\\\b'\n";
            let out = pieces(input.as_bytes(), e, 3, 2);
            assert_eq!(records(&out, e), capped(&normalise(input.as_bytes(), e), e));
            assert_eq!(
                records(&out, e)[1],
                [missing, b"#".to_vec(), b"a\\b".to_vec()]
            );
        }
    }

    /// Round 51: a field over the cap that is not UTF-8, anywhere in it (a byte past the cap, a
    /// character cut by the end of the field), still makes its record a row of NULLs, as the
    /// whole field did; a character cut between two pieces of the file is UTF-8.
    #[test]
    fn a_field_over_the_cap_is_still_checked_as_utf8() {
        let d = CsvDialect {
            max_value_bytes: Some(4),
            ..dialect(Some(2))
        };
        let bad: [&[u8]; 3] = [
            b"a,abcdefgh\xff\n",
            b"a,\"abcdefg\xc3\"\n",
            b"a,abcdefg\xe2\x82\n",
        ];
        for input in bad {
            for (piece, room) in [(1, 1), (2, 3), (100, 4096)] {
                let mut all = b"g,v\n".to_vec();
                all.extend_from_slice(input);
                all.extend_from_slice(b"b,1\n");
                assert_eq!(pieces(&all, d, piece, room), b"g,v\n,\nb,1\n", "{input:?}");
            }
        }
        let good = "g,v\na,abc€déf€\nb,1\n";
        for (piece, room) in [(1, 1), (2, 3), (5, 2), (100, 4096)] {
            assert_eq!(pieces(good.as_bytes(), d, piece, room), b"g,v\na,\nb,1\n");
        }
    }

    /// Round 51: whatever the bytes, the dialect, the cap, the pieces and the buffer, the
    /// output with the cap is the output without it with each field over the cap missing.
    #[test]
    fn any_input_reads_with_the_cap_as_without_it_but_for_fields_over_it() {
        let alphabet = b"abc,;\"'\n\r\\#\xff\xc3\xa9 ";
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..4000 {
            let d = CsvDialect {
                delimiter: [b',', b';'][round % 2],
                quote: [b'"', b'\''][round / 2 % 2],
                escape: [None, Some(b'\\')][round / 4 % 2],
                comment: [None, Some(b'#')][round / 8 % 2],
                columns: [None, Some(1 + round % 3)][round / 16 % 2],
                max_value_bytes: None,
                empty_is_null: round / 32 % 2 == 0,
            };
            let len = (next() % 60) as usize;
            let input: Vec<u8> = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            let with = d.with_max_value_bytes(1 + (next() % 5) as usize);
            let (piece, room) = (1 + (next() % 9) as usize, 1 + (next() % 6) as usize);
            let uncapped = normalise(&input, d);
            let out = pieces(&input, with, piece, room);
            assert_eq!(
                records(&out, with),
                capped(&uncapped, with),
                "{input:?} {with:?} {piece} {room} -> {:?}",
                String::from_utf8_lossy(&out)
            );
        }
    }

    /// Round 51 (review "limits" F1): a record with a field of 10 MB (quoted, with line ends,
    /// quotes and delimiters in it) keeps a buffer of a few times the cap (64 KiB), not the
    /// field (before: 16 MiB, and arrow-csv's copy after); its other fields and the next
    /// record read as they are. A record of fields each just under the cap keeps them, in
    /// about twice the table's width times the cap.
    #[test]
    fn a_huge_field_is_not_kept() {
        let cap = 64 << 10;
        let d = dialect(Some(3)).with_max_value_bytes(cap);
        let mut input = b"g,v,w\na,\"".to_vec();
        for i in 0..(10 << 20) / 8 {
            input.extend_from_slice([&b"xyz,\"\"\r\n"[..], b"abcdefgh"][i % 2]);
        }
        input.extend_from_slice(b"\",last\nb,c,d\n");
        let mut n = Normaliser::new(d);
        let mut out = vec![];
        for chunk in input.chunks(1 << 20) {
            n.feed(chunk, &mut out);
            assert!(n.fields.capacity() <= 4 * cap, "{}", n.fields.capacity());
        }
        n.finish(&mut out);
        assert_eq!(out, b"g,v,w\na,,last\nb,c,d\n");
        assert!(n.fields.capacity() <= 4 * cap, "{}", n.fields.capacity());
        assert_eq!(n.ends.capacity(), 64);

        // Three fields of exactly the cap: kept whole.
        let row = ["p".repeat(cap), "q".repeat(cap), "r".repeat(cap)].join(",");
        let mut n = Normaliser::new(d);
        let mut out = vec![];
        n.feed(format!("g,v,w\n{row}\n").as_bytes(), &mut out);
        n.finish(&mut out);
        assert_eq!(out, format!("g,v,w\n{row}\n").as_bytes());
        assert!(
            n.fields.capacity() <= 2 * 3 * cap,
            "{}",
            n.fields.capacity()
        );
        // Many fields each under the cap, more than the table has: a row of NULLs, in the
        // buffers it has.
        let wide = "a".repeat(1000) + &",a".repeat(1 << 20) + "\n";
        let mut n = Normaliser::new(d);
        let mut out = vec![];
        n.feed(b"g,v,w\n", &mut out);
        n.feed(wide.as_bytes(), &mut out);
        n.finish(&mut out);
        assert_eq!(out, b"g,v,w\n,,\n");
        assert_eq!((n.fields.capacity(), n.ends.capacity()), (4096, 64));
    }
}
