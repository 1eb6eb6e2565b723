package sketchshare

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
)

// ErrCorruptPeerData is wrapped by the error of every piece of peer data
// that was ignored: a field that does not decode, snapshots the estimator
// refuses to merge, or an index entry that names no cohort. Ignoring it
// leaves the rest of the round intact.
var ErrCorruptPeerData = errors.New("sketchshare: corrupt peer data")

// A field value is "<published unix ms>|" followed by the binary payload:
//
//	byte    format version (fieldVersion)
//	uvarint number of slot snapshots
//	per snapshot: varint Index, varint Width (ns), 8 bytes Count (float64
//	bits, little endian), uvarint sketch length, sketch bytes
//
// The decimal timestamp in front lets the exchange script judge a field's
// age without decoding it.
const fieldVersion = 1

// Decoding limits: a window has a few dozen slots and each sketch a few
// kilobytes, so anything far beyond is corruption, refused before it can
// make the decoder allocate.
const (
	maxSnapshotsPerField = 1024
	maxSketchBytes       = 1 << 20
)

// encodeField renders one replica's snapshots of a cohort, published at now.
func encodeField(now time.Time, snaps []delay.SlotSnapshot) string {
	size := 24
	for _, s := range snaps {
		size += 3*binary.MaxVarintLen64 + 8 + len(s.Sketch)
	}
	b := make([]byte, 0, size)
	b = strconv.AppendInt(b, now.UnixMilli(), 10)
	b = append(b, '|', fieldVersion)
	b = binary.AppendUvarint(b, uint64(len(snaps)))
	for _, s := range snaps {
		b = binary.AppendVarint(b, s.Index)
		b = binary.AppendVarint(b, int64(s.Width))
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.Count))
		b = binary.AppendUvarint(b, uint64(len(s.Sketch)))
		b = append(b, s.Sketch...)
	}
	return string(b)
}

// decodeField parses a field written by encodeField. It checks framing and
// bounds only; whether the sketches decode and fit the window is for
// Estimator.Merge to judge.
func decodeField(v string) (published time.Time, snaps []delay.SlotSnapshot, err error) {
	head, payload, ok := strings.Cut(v, "|")
	if !ok {
		return time.Time{}, nil, errors.New("no timestamp")
	}
	ms, err := strconv.ParseInt(head, 10, 64)
	if err != nil || ms < 0 {
		return time.Time{}, nil, fmt.Errorf("timestamp %q is not a non-negative integer", head)
	}
	published = time.UnixMilli(ms)
	b := []byte(payload)
	if len(b) == 0 || b[0] != fieldVersion {
		return time.Time{}, nil, errors.New("unknown format version")
	}
	b = b[1:]
	n, b, err := readUvarint(b, "snapshot count")
	if err != nil {
		return time.Time{}, nil, err
	}
	if n > maxSnapshotsPerField {
		return time.Time{}, nil, fmt.Errorf("%d snapshots, at most %d", n, maxSnapshotsPerField)
	}
	snaps = make([]delay.SlotSnapshot, 0, n)
	for i := range n {
		var s delay.SlotSnapshot
		if s.Index, b, err = readVarint(b, "slot index"); err != nil {
			return time.Time{}, nil, fmt.Errorf("snapshot %d: %w", i, err)
		}
		var width int64
		if width, b, err = readVarint(b, "slot width"); err != nil {
			return time.Time{}, nil, fmt.Errorf("snapshot %d: %w", i, err)
		}
		if width <= 0 {
			return time.Time{}, nil, fmt.Errorf("snapshot %d: slot width %d is not positive", i, width)
		}
		s.Width = time.Duration(width)
		if len(b) < 8 {
			return time.Time{}, nil, fmt.Errorf("snapshot %d: truncated count", i)
		}
		s.Count = math.Float64frombits(binary.LittleEndian.Uint64(b))
		b = b[8:]
		if math.IsNaN(s.Count) || math.IsInf(s.Count, 0) || s.Count < 0 {
			return time.Time{}, nil, fmt.Errorf("snapshot %d: count %v", i, s.Count)
		}
		var size uint64
		if size, b, err = readUvarint(b, "sketch length"); err != nil {
			return time.Time{}, nil, fmt.Errorf("snapshot %d: %w", i, err)
		}
		if size > maxSketchBytes || size > uint64(len(b)) {
			return time.Time{}, nil, fmt.Errorf("snapshot %d: sketch of %d bytes, %d left", i, size, len(b))
		}
		s.Sketch, b = b[:size:size], b[size:]
		snaps = append(snaps, s)
	}
	if len(b) != 0 {
		return time.Time{}, nil, fmt.Errorf("%d trailing bytes", len(b))
	}
	return published, snaps, nil
}

func readUvarint(b []byte, what string) (uint64, []byte, error) {
	v, n := binary.Uvarint(b)
	if n <= 0 {
		return 0, nil, fmt.Errorf("bad %s", what)
	}
	return v, b[n:], nil
}

func readVarint(b []byte, what string) (int64, []byte, error) {
	v, n := binary.Varint(b)
	if n <= 0 {
		return 0, nil, fmt.Errorf("bad %s", what)
	}
	return v, b[n:], nil
}
