// Package tensorboard writes and reads TensorBoard event files holding scalar summaries.
//
// An event file is a sequence of TFRecords, each holding one serialized tensorboard.Event
// protocol buffer. The first record carries the file version ("brain.Event:2"); each later
// record carries one step's scalars as a Summary with one simple_value per tag. The writer
// encodes the messages by hand with protowire; [ReadFile] decodes them independently, through
// descriptors built at run time and the protobuf library's generic decoder, so that each
// checks the other.
//
// Layer: tensorboard imports only the standard library and google.golang.org/protobuf.
package tensorboard

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// FileVersion is the file_version of the first record of every event file written here.
const FileVersion = "brain.Event:2"

// Field numbers from TensorBoard's event.proto and summary.proto.
const (
	eventWallTime    protowire.Number = 1 // double
	eventStep        protowire.Number = 2 // int64
	eventFileVersion protowire.Number = 3 // string
	eventSummary     protowire.Number = 5 // Summary
	summaryValue     protowire.Number = 1 // repeated Summary.Value
	valueTag         protowire.Number = 1 // string
	valueSimpleValue protowire.Number = 2 // float
)

// castagnoli is the CRC-32C table of the TFRecord checksums.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maskedCRC is the TFRecord checksum of b: its CRC-32C, rotated right by 15 bits plus a
// constant.
func maskedCRC(b []byte) uint32 {
	return mask(crc32.Checksum(b, castagnoli))
}

// mask is TFRecord's masking of a CRC.
func mask(crc uint32) uint32 {
	return (crc>>15 | crc<<17) + 0xa282ead8
}

// appendRecord appends data framed as one TFRecord to b: the little-endian uint64 length, the
// masked CRC of those 8 bytes, the data, and the masked CRC of the data.
func appendRecord(b, data []byte) []byte {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(data)))
	b = append(b, n[:]...)
	b = binary.LittleEndian.AppendUint32(b, maskedCRC(n[:]))
	b = append(b, data...)
	return binary.LittleEndian.AppendUint32(b, maskedCRC(data))
}

// encodeVersionEvent is the serialized Event that opens a file.
func encodeVersionEvent(wall float64) []byte {
	var b []byte
	b = protowire.AppendTag(b, eventWallTime, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, math.Float64bits(wall))
	b = protowire.AppendTag(b, eventFileVersion, protowire.BytesType)
	return protowire.AppendString(b, FileVersion)
}

// encodeScalarsEvent is the serialized Event holding one Summary.Value per value that is
// finite as a float32, tags in sorted order. A zero step is left out, as proto3 leaves out default values.
func encodeScalarsEvent(step int64, wall float64, values map[string]float64) []byte {
	var b []byte
	b = protowire.AppendTag(b, eventWallTime, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, math.Float64bits(wall))
	if step != 0 {
		b = protowire.AppendTag(b, eventStep, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(step))
	}
	var summary []byte
	for _, tag := range slices.Sorted(maps.Keys(values)) {
		v := float32(values[tag])
		if v != v || math.IsInf(float64(v), 0) {
			continue // NaN or infinite, or too large for a float32
		}
		var val []byte
		val = protowire.AppendTag(val, valueTag, protowire.BytesType)
		val = protowire.AppendString(val, tag)
		val = protowire.AppendTag(val, valueSimpleValue, protowire.Fixed32Type)
		val = protowire.AppendFixed32(val, math.Float32bits(v))
		summary = protowire.AppendTag(summary, summaryValue, protowire.BytesType)
		summary = protowire.AppendBytes(summary, val)
	}
	b = protowire.AppendTag(b, eventSummary, protowire.BytesType)
	return protowire.AppendBytes(b, summary)
}

// now is the clock that names new files; tests replace it.
var now = time.Now

// seconds is t as TensorBoard's wall_time: seconds since the Unix epoch. Whole seconds and
// the fraction are converted apart, so that a time such as 1.25 s past a second is exact
// (UnixNano exceeds float64's 53-bit mantissa).
func seconds(t time.Time) float64 {
	return float64(t.Unix()) + float64(t.Nanosecond())/1e9
}

// Writer appends scalar summaries to one event file. A Writer is not safe for concurrent
// use.
type Writer struct {
	path string
	f    *os.File
	bw   *bufio.Writer
	buf  []byte
}

// Create makes dir and any missing parents, starts a new event file in it named
// events.out.tfevents.<unix seconds>.<hostname>, and writes its file_version record. If that
// name is taken, a suffix .1, .2, ... is added: an existing file is never overwritten.
func Create(dir string) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("tensorboard: %w", err)
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	t := now()
	base := filepath.Join(dir, fmt.Sprintf("events.out.tfevents.%010d.%s", t.Unix(), host))
	var (
		f    *os.File
		path string
	)
	for i := 0; ; i++ {
		path = base
		if i > 0 {
			path = base + "." + strconv.Itoa(i)
		}
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("tensorboard: create event file: %w", err)
		}
	}
	w := &Writer{path: path, f: f, bw: bufio.NewWriter(f)}
	err = w.write(encodeVersionEvent(seconds(t)))
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return w, nil
}

// write frames data as one record and buffers it.
func (w *Writer) write(data []byte) error {
	w.buf = appendRecord(w.buf[:0], data)
	if _, err := w.bw.Write(w.buf); err != nil {
		return fmt.Errorf("tensorboard: write %s: %w", w.path, err)
	}
	return nil
}

// Scalars appends one event at step and wall time wall holding one value per tag of values,
// tags in sorted order, each stored as float32. NaN and infinite values, and those too large
// for a float32, are skipped. The record is buffered: call [Writer.Flush] for it to reach
// the file.
func (w *Writer) Scalars(step int64, wall time.Time, values map[string]float64) error {
	return w.write(encodeScalarsEvent(step, seconds(wall), values))
}

// Flush writes the buffered records to the file.
func (w *Writer) Flush() error {
	if err := w.bw.Flush(); err != nil {
		return fmt.Errorf("tensorboard: write %s: %w", w.path, err)
	}
	return nil
}

// Path returns the path of the event file.
func (w *Writer) Path() string {
	return w.path
}

// Close flushes the buffered records and closes the file.
func (w *Writer) Close() error {
	err := w.Flush()
	if cerr := w.f.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("tensorboard: close %s: %w", w.path, cerr)
	}
	return err
}
