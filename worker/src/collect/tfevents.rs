//! Reads TensorBoard event files (`events.out.tfevents.*`, written by
//! `torch.utils.tensorboard`, tensorboardX, Lightning's `TensorBoardLogger` and Keras/TF) and
//! turns their scalar summaries into metric points.
//!
//! The file is a TFRecord stream of `Event` protobufs: per record a little-endian u64 length,
//! its masked CRC-32C, the data and the data's masked CRC-32C. Scalars are either a
//! `simple_value` or a one-element numeric `tensor` (the `scalars` plugin's new style);
//! histograms, images, text and other plugins' tensors are skipped, and records too large to be
//! a scalar event are checked but never held whole. A record still being written (the file ends
//! inside it) is left for a later call. A bad checksum or an undecodable event ends the reading
//! of the file: records carry no sync marker to resume from, and TensorFlow's own record reader
//! (and TensorBoard, which retries later from the same offset) stop at the same point.

use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use prost::Message;
use shared::api::MetricPoint;

/// Largest record decoded: scalar events are tens of bytes; bigger ones are images and such.
pub const MAX_RECORD: u64 = 1 << 20;
/// The piece in which a record over [`MAX_RECORD`] is streamed through its checksum.
const PIECE: usize = 64 * 1024;
/// Length (8 bytes) and its checksum (4) before the data; the data's checksum (4) after.
const HEADER: u64 = 12;
const FOOTER: u64 = 4;

const DT_FLOAT: i32 = 1;
const DT_DOUBLE: i32 = 2;
const DT_INT32: i32 = 3;
const DT_INT64: i32 = 9;
const DT_BFLOAT16: i32 = 14;
const DT_HALF: i32 = 19;

/// What one [`read_from`] call found.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub points: Vec<MetricPoint>,
    /// Where the next call goes on: after the last whole record read, or at the damage.
    pub offset: u64,
    /// Why reading this file must stop, naming the byte offset of the bad record.
    pub damage: Option<String>,
    /// The file ends inside the record at `offset` (its writer may still be writing it).
    pub torn: bool,
}

/// The largest record taken at all: TensorFlow's writers stay far below (a summary's image or
/// histogram is megabytes); a larger length is damage, not a record to wait for.
const MAX_ANY_RECORD: u64 = 1 << 30;

/// TensorBoard's own test (`"tfevents" in basename`), which also takes its empty
/// `.profile-empty` files.
pub fn is_event_file(name: &str) -> bool {
    Path::new(name).file_name().is_some_and(|base| base.to_string_lossy().contains("tfevents"))
}

/// Reads whole records from `offset` on, at most `budget` bytes of them (the first record is
/// always read, so every call makes progress); a later call goes on from the returned offset.
/// A torn last record is left unread; after damage the caller reads no more of this file.
pub fn read_from<R: Read + Seek>(file: &mut R, offset: u64, budget: u64) -> io::Result<Chunk> {
    let length = file.seek(SeekFrom::End(0))?;
    file.seek(SeekFrom::Start(offset))?;
    let mut reader = BufReader::with_capacity(PIECE, file);
    let mut chunk = Chunk { points: Vec::new(), offset, damage: None, torn: false };
    loop {
        let consumed = chunk.offset - offset;
        let room = if consumed == 0 { u64::MAX } else { budget.saturating_sub(consumed) };
        match next_record(&mut reader, chunk.offset, room, length)? {
            Record::Whole { size, event } => {
                chunk.points.extend(event.into_iter().flat_map(points_of));
                chunk.offset += size;
                continue;
            }
            Record::Torn => chunk.torn = true,
            Record::Damaged(reason) => chunk.damage = Some(reason),
            Record::End | Record::OverBudget => {}
        }
        return Ok(chunk);
    }
}

enum Record {
    End,
    Torn,
    OverBudget,
    Damaged(String),
    /// `event` is `None` for a record over [`MAX_RECORD`], checked but not decoded.
    Whole {
        size: u64,
        event: Option<Event>,
    },
}

fn next_record(reader: &mut impl BufRead, at: u64, room: u64, length: u64) -> io::Result<Record> {
    let header = read_up_to(reader, HEADER)?;
    if header.is_empty() {
        return Ok(Record::End);
    }
    if header.len() < HEADER as usize {
        return Ok(Record::Torn);
    }
    if masked(crc32c::crc32c(&header[..8])) != le_u32(&header[8..]) {
        return Ok(Record::Damaged(format!("bad length crc in record at byte {at}")));
    }
    let len = u64::from_le_bytes(header[..8].try_into().expect("8 length bytes"));
    if len > MAX_ANY_RECORD {
        return Ok(Record::Damaged(format!("a record of {len} bytes claimed at byte {at}")));
    }
    let size = len.saturating_add(HEADER + FOOTER);
    // Not all written yet: wait for it without reading what is there of it (a long record
    // would otherwise be read again on every pass until its end arrives).
    if at.saturating_add(size) > length {
        return Ok(Record::Torn);
    }
    if size > room {
        return Ok(Record::OverBudget);
    }
    let (crc, data) = if len > MAX_RECORD {
        // Through the reader's own buffer, one piece at a time.
        let (mut crc, mut left) = (0, len);
        while left > 0 {
            let piece = reader.fill_buf()?;
            if piece.is_empty() {
                return Ok(Record::Torn);
            }
            let taken = piece.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            crc = crc32c::crc32c_append(crc, &piece[..taken]);
            reader.consume(taken);
            left -= taken as u64;
        }
        (crc, None)
    } else {
        let data = read_up_to(reader, len)?;
        if (data.len() as u64) < len {
            return Ok(Record::Torn);
        }
        (crc32c::crc32c(&data), Some(data))
    };
    let footer = read_up_to(reader, FOOTER)?;
    if footer.len() < FOOTER as usize {
        return Ok(Record::Torn);
    }
    if masked(crc) != le_u32(&footer) {
        return Ok(Record::Damaged(format!("bad data crc in record at byte {at}")));
    }
    match data.map(|data| Event::decode(data.as_slice())).transpose() {
        Ok(event) => Ok(Record::Whole { size, event }),
        Err(error) => Ok(Record::Damaged(format!("undecodable event in record at byte {at}: {error}"))),
    }
}

/// `len` bytes (at most [`MAX_RECORD`]), or fewer where the file ends first.
fn read_up_to(reader: &mut impl BufRead, len: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(len as usize);
    reader.by_ref().take(len).read_to_end(&mut bytes)?;
    Ok(bytes)
}

fn masked(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn le_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes.try_into().expect("4 crc bytes"))
}

fn points_of(event: Event) -> impl Iterator<Item = MetricPoint> {
    let step = Some(event.step);
    event.summary.into_iter().flat_map(|summary| summary.value).filter_map(move |value| {
        let plugin = value.metadata.as_ref().and_then(|m| m.plugin_data.as_ref()).map_or("", |p| &p.plugin_name);
        if (!plugin.is_empty() && plugin != "scalars") || value.tag.is_empty() {
            return None;
        }
        let number = match &value.kind {
            Some(Kind::SimpleValue(number)) => f64::from(*number),
            Some(Kind::Tensor(tensor)) => scalar_of(tensor)?,
            None => return None,
        };
        number.is_finite().then_some(MetricPoint { step, name: value.tag, value: number })
    })
}

/// The value of a one-element numeric tensor, from its typed field or its little-endian
/// `tensor_content`; `None` for anything else, empty fields included (TensorBoard's
/// `make_ndarray` fails on those).
fn scalar_of(tensor: &TensorProto) -> Option<f64> {
    // No shape at all (torch's `new_style` scalars) is rank 0 too.
    let shape = tensor.tensor_shape.as_ref();
    if shape.is_some_and(|shape| shape.unknown_rank || shape.dim.iter().any(|dim| dim.size != 1)) {
        return None;
    }
    let content = tensor.tensor_content.as_slice();
    if !content.is_empty() {
        return match tensor.dtype {
            DT_FLOAT => content.try_into().ok().map(|b| f64::from(f32::from_le_bytes(b))),
            DT_DOUBLE => content.try_into().ok().map(f64::from_le_bytes),
            DT_INT32 => content.try_into().ok().map(|b| f64::from(i32::from_le_bytes(b))),
            DT_INT64 => content.try_into().ok().map(|b| i64::from_le_bytes(b) as f64),
            DT_HALF => content.try_into().ok().map(|b| half_to_f64(u16::from_le_bytes(b))),
            DT_BFLOAT16 => content.try_into().ok().map(|b| bfloat16_to_f64(u16::from_le_bytes(b))),
            _ => None,
        };
    }
    match tensor.dtype {
        DT_FLOAT => single(&tensor.float_val).map(f64::from),
        DT_DOUBLE => single(&tensor.double_val),
        DT_INT32 => single(&tensor.int_val).map(f64::from),
        DT_INT64 => single(&tensor.int64_val).map(|number| number as f64),
        // `half_val` holds the 16 bits of each value in an int32.
        DT_HALF => single(&tensor.half_val).map(|bits| half_to_f64(bits as u16)),
        DT_BFLOAT16 => single(&tensor.half_val).map(|bits| bfloat16_to_f64(bits as u16)),
        _ => None,
    }
}

fn single<T: Copy>(values: &[T]) -> Option<T> {
    match values {
        [value] => Some(*value),
        _ => None,
    }
}

fn half_to_f64(bits: u16) -> f64 {
    let sign = if bits & 0x8000 == 0 { 1.0 } else { -1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let fraction = f64::from(bits & 0x3ff);
    sign * match exponent {
        0 => fraction * 2f64.powi(-24),
        0x1f if fraction == 0.0 => f64::INFINITY,
        0x1f => f64::NAN,
        _ => (1.0 + fraction / 1024.0) * 2f64.powi(exponent - 15),
    }
}

fn bfloat16_to_f64(bits: u16) -> f64 {
    f64::from(f32::from_bits(u32::from(bits) << 16))
}

// The fields of TensorFlow's event.proto, summary.proto, tensor.proto and tensor_shape.proto
// that scalars need; prost skips the others.

#[derive(Clone, PartialEq, Message)]
struct Event {
    #[prost(int64, tag = "2")]
    step: i64,
    /// One member of the `what` oneof, the only one read.
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

#[derive(Clone, PartialEq, Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

#[derive(Clone, PartialEq, Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(message, optional, tag = "9")]
    metadata: Option<SummaryMetadata>,
    /// The `value` oneof, so a `simple_value` of 0.0 is still present.
    #[prost(oneof = "Kind", tags = "2, 8")]
    kind: Option<Kind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Kind {
    #[prost(float, tag = "2")]
    SimpleValue(f32),
    #[prost(message, tag = "8")]
    Tensor(TensorProto),
}

#[derive(Clone, PartialEq, Message)]
struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    plugin_data: Option<PluginData>,
}

#[derive(Clone, PartialEq, Message)]
struct PluginData {
    #[prost(string, tag = "1")]
    plugin_name: String,
}

#[derive(Clone, PartialEq, Message)]
struct TensorProto {
    #[prost(int32, tag = "1")]
    dtype: i32,
    #[prost(message, optional, tag = "2")]
    tensor_shape: Option<TensorShape>,
    #[prost(bytes = "vec", tag = "4")]
    tensor_content: Vec<u8>,
    #[prost(float, repeated, tag = "5")]
    float_val: Vec<f32>,
    #[prost(double, repeated, tag = "6")]
    double_val: Vec<f64>,
    #[prost(int32, repeated, tag = "7")]
    int_val: Vec<i32>,
    #[prost(int64, repeated, tag = "10")]
    int64_val: Vec<i64>,
    #[prost(int32, repeated, tag = "13")]
    half_val: Vec<i32>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorShape {
    #[prost(message, repeated, tag = "2")]
    dim: Vec<Dim>,
    #[prost(bool, tag = "3")]
    unknown_rank: bool,
}

#[derive(Clone, PartialEq, Message)]
struct Dim {
    #[prost(int64, tag = "1")]
    size: i64,
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    fn record(data: &[u8]) -> Vec<u8> {
        let len = (data.len() as u64).to_le_bytes();
        let len_crc = masked(crc32c::crc32c(&len)).to_le_bytes();
        [&len[..], &len_crc, data, &masked(crc32c::crc32c(data)).to_le_bytes()].concat()
    }

    fn event(step: i64, value: Vec<SummaryValue>) -> Vec<u8> {
        record(&Event { step, summary: Some(Summary { value }) }.encode_to_vec())
    }

    fn simple(tag: &str, number: f32) -> SummaryValue {
        SummaryValue { tag: tag.into(), metadata: None, kind: Some(Kind::SimpleValue(number)) }
    }

    fn tensor(tag: &str, plugin: &str, tensor: TensorProto) -> SummaryValue {
        let metadata = Some(SummaryMetadata { plugin_data: Some(PluginData { plugin_name: plugin.into() }) });
        SummaryValue { tag: tag.into(), metadata, kind: Some(Kind::Tensor(tensor)) }
    }

    fn point(step: i64, name: &str, value: f64) -> MetricPoint {
        MetricPoint { step: Some(step), name: name.into(), value }
    }

    fn read_all(bytes: &[u8]) -> Chunk {
        read_from(&mut Cursor::new(bytes), 0, u64::MAX).unwrap()
    }

    #[test]
    fn simple_values_and_scalar_tensors_are_points() {
        let proto = |dtype: i32, dims: &[i64], fill: fn(&mut TensorProto)| {
            let dim = dims.iter().map(|&size| Dim { size }).collect();
            let tensor_shape = Some(TensorShape { dim, unknown_rank: false });
            let mut proto = TensorProto { dtype, tensor_shape, ..Default::default() };
            fill(&mut proto);
            proto
        };
        let values = vec![
            simple("val/loss", 0.5),
            simple("zero", 0.0),
            // torch's `add_scalar(new_style=True)` writes no shape at all.
            tensor("f", "scalars", TensorProto { dtype: DT_FLOAT, float_val: vec![1.5], ..Default::default() }),
            tensor("d", "", proto(DT_DOUBLE, &[], |t| t.double_val = vec![0.1])),
            tensor("cf", "scalars", proto(DT_FLOAT, &[], |t| t.tensor_content = 2.5f32.to_le_bytes().into())),
            tensor("cd", "scalars", proto(DT_DOUBLE, &[1, 1], |t| t.tensor_content = 0.1f64.to_le_bytes().into())),
            tensor("i", "scalars", proto(DT_INT64, &[], |t| t.int64_val = vec![-7])),
            tensor("h", "scalars", proto(DT_HALF, &[], |t| t.half_val = vec![0x3e00])),
            tensor("b", "scalars", proto(DT_BFLOAT16, &[1], |t| t.tensor_content = 0x3fc0u16.to_le_bytes().into())),
            // Skipped: two elements (one value fills the shape), another plugin, a string, not finite.
            tensor("vector", "scalars", proto(DT_FLOAT, &[2], |t| t.float_val = vec![1.0])),
            tensor("hist", "histograms", proto(DT_DOUBLE, &[], |t| t.double_val = vec![1.0])),
            tensor("text", "", proto(7, &[], |t| t.tensor_content = b"word".to_vec())),
            simple("nan", f32::NAN),
            tensor("inf", "scalars", proto(DT_DOUBLE, &[], |t| t.double_val = vec![f64::INFINITY])),
        ];
        let expected =
            [("val/loss", 0.5), ("zero", 0.0), ("f", 1.5), ("d", 0.1), ("cf", 2.5), ("cd", 0.1), ("i", -7.0)];
        let expected = expected.into_iter().chain([("h", 1.5), ("b", 1.5)]);
        let expected: Vec<_> = expected.map(|(name, value)| point(9, name, value)).collect();
        let file_version = record(&[0x1a, 0x0d].iter().chain(b"brain.Event:2").copied().collect::<Vec<_>>());
        let bytes = [file_version, event(9, values), event(10, vec![])].concat();
        let chunk = read_all(&bytes);
        assert_eq!(chunk.points, expected);
        assert_eq!((chunk.offset, chunk.damage, chunk.torn), (bytes.len() as u64, None, false));
    }

    #[test]
    fn torn_last_record_is_left_until_its_rest_is_written() {
        let (first, second) = (event(1, vec![simple("a", 1.0)]), event(2, vec![simple("a", 2.0)]));
        let bytes = [first.clone(), second].concat();
        let start = first.len() as u64;
        for cut in [first.len() + 5, first.len() + 12, first.len() + 20, bytes.len() - 2] {
            let chunk = read_all(&bytes[..cut]);
            assert_eq!((chunk.points, chunk.offset, chunk.torn), (vec![point(1, "a", 1.0)], start, true), "{cut}");
            let rest = read_from(&mut Cursor::new(&bytes), chunk.offset, u64::MAX).unwrap();
            assert_eq!((rest.points, rest.torn, rest.damage), (vec![point(2, "a", 2.0)], false, None));
        }
    }

    #[test]
    fn damage_stops_at_the_bad_record_keeping_earlier_points() {
        let first = event(1, vec![simple("a", 1.0)]);
        let start = first.len();
        for (flip, reason) in [(start + 8, "bad length crc"), (start + 14, "bad data crc")] {
            let mut bytes =
                [first.clone(), event(2, vec![simple("a", 2.0)]), event(3, vec![simple("a", 3.0)])].concat();
            bytes[flip] ^= 1;
            let chunk = read_all(&bytes);
            assert_eq!((chunk.points, chunk.offset), (vec![point(1, "a", 1.0)], start as u64));
            assert_eq!(chunk.damage.unwrap(), format!("{reason} in record at byte {start}"));
        }
        let chunk = read_all(&[first, record(&[0xff; 3])].concat());
        assert!(chunk.damage.unwrap().starts_with(&format!("undecodable event in record at byte {start}")));
    }

    /// Counts the largest read asked of the file.
    struct Watched<R> {
        inner: R,
        largest_read: usize,
    }

    impl<R: Read> Read for Watched<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.largest_read = self.largest_read.max(buf.len());
            self.inner.read(buf)
        }
    }

    impl<R: Seek> Seek for Watched<R> {
        fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
            self.inner.seek(pos)
        }
    }

    #[test]
    fn a_large_record_is_checked_in_pieces_and_skipped() {
        // Never decoded, whatever it holds (in life: an image or a histogram).
        let image = record(&vec![7u8; 3 << 20]);
        let bytes = [event(1, vec![simple("a", 1.0)]), image.clone(), event(2, vec![simple("a", 2.0)])].concat();
        let mut file = Watched { inner: Cursor::new(&bytes), largest_read: 0 };
        let chunk = read_from(&mut file, 0, u64::MAX).unwrap();
        assert_eq!(chunk.points, vec![point(1, "a", 1.0), point(2, "a", 2.0)]);
        assert_eq!((chunk.offset, chunk.damage), (bytes.len() as u64, None));
        assert!(file.largest_read <= PIECE, "read {} bytes at once", file.largest_read);
        let torn = read_all(&image[..image.len() - 1]);
        assert_eq!((torn.offset, torn.torn), (0, true));
    }

    #[test]
    fn a_budget_splits_the_reading_into_calls_with_the_same_points() {
        let bytes: Vec<u8> = (0..20).flat_map(|step| event(step, vec![simple("loss", step as f32)])).collect();
        let (mut offset, mut points, mut calls) = (0, Vec::new(), 0);
        loop {
            let chunk = read_from(&mut Cursor::new(&bytes), offset, 100).unwrap();
            if chunk.offset == offset {
                break;
            }
            (offset, calls) = (chunk.offset, calls + 1);
            points.extend(chunk.points);
        }
        assert!(calls > 5, "{calls} calls");
        assert_eq!((offset, points), (bytes.len() as u64, read_all(&bytes).points));
    }

    #[test]
    fn reads_a_file_written_by_tensorboardx() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tfevents/scalars.tfevents");
        let chunk = read_from(&mut std::fs::File::open(path).unwrap(), 0, u64::MAX).unwrap();
        let mut expected: Vec<_> =
            (0..10).map(|step| point(step, "val/loss", f64::from((1.0 - 0.1 * step as f64) as f32))).collect();
        expected.extend([point(0, "train/lr", 0.0), point(3, "train/acc", 0.5), point(4, "epoch_loss", 0.25)]);
        assert_eq!(chunk.points, expected);
        assert_eq!((chunk.offset, chunk.damage, chunk.torn), (std::fs::metadata(path).unwrap().len(), None, false));
    }

    #[test]
    fn event_files_are_named_as_tensorboard_names_them() {
        assert!(is_event_file("runs/exp/events.out.tfevents.1700000000.host.12.0"));
        assert!(is_event_file("events.out.tfevents.1700000000.host.profile-empty"));
        assert!(!is_event_file("tfevents/metrics.csv"));
    }
}
