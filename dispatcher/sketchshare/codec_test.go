package sketchshare

import (
	"encoding/binary"
	"math"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
)

// sampleSnapshots returns real snapshots of an estimator that saw a few
// samples in three slots.
func sampleSnapshots(t testing.TB) []delay.SlotSnapshot {
	t.Helper()
	e := mustEstimator(t, delay.Options{Window: time.Minute, Slots: 6})
	for i := range 30 {
		if err := e.ObservePrimary(chatStream, t0.Add(time.Duration(i)*time.Second), time.Duration(100+i)*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	snaps := e.Snapshot(chatStream, t0.Add(30*time.Second))
	if len(snaps) != 3 {
		t.Fatalf("fixture has %d slots, want 3", len(snaps))
	}
	return snaps
}

func TestFieldEncodingRoundTripsSnapshotsAndPublicationTime(t *testing.T) {
	snaps := sampleSnapshots(t)
	now := t0.Add(1234567 * time.Microsecond)
	for _, in := range [][]delay.SlotSnapshot{snaps, nil} {
		published, out, err := decodeField(encodeField(now, in))
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if !published.Equal(now.Truncate(time.Millisecond)) {
			t.Fatalf("published %v, want %v to the millisecond", published, now)
		}
		if len(in) == 0 && len(out) == 0 {
			continue
		}
		if !reflect.DeepEqual(out, in) {
			t.Fatalf("decoded %+v, want %+v", out, in)
		}
	}
}

func TestDecodeFieldRejectsMalformedValuesWithAnError(t *testing.T) {
	valid := encodeField(t0, sampleSnapshots(t))
	stamp := strconv.FormatInt(t0.UnixMilli(), 10) + "|"
	snap := func(index, width int64, count float64, sketchLen uint64, sketch []byte) string {
		b := []byte{fieldVersion}
		b = binary.AppendUvarint(b, 1)
		b = binary.AppendVarint(b, index)
		b = binary.AppendVarint(b, width)
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(count))
		b = binary.AppendUvarint(b, sketchLen)
		return stamp + string(append(b, sketch...))
	}
	tests := []struct{ name, value string }{
		{"empty", ""},
		{"no timestamp", "garbage"},
		{"negative timestamp", "-5|" + valid[len(stamp):]},
		{"timestamp not a number", "soon|" + valid[len(stamp):]},
		{"no payload", stamp},
		{"unknown version", stamp + "\x09\x00"},
		{"snapshot count beyond the bound", stamp + string(binary.AppendUvarint([]byte{fieldVersion}, maxSnapshotsPerField+1))},
		{"zero slot width", snap(1, 0, 1, 1, []byte{0})},
		{"negative count", snap(1, 10, -1, 1, []byte{0})},
		{"NaN count", snap(1, 10, math.NaN(), 1, []byte{0})},
		{"sketch longer than the value", snap(1, 10, 1, 5, []byte{0})},
		{"sketch beyond the bound", snap(1, 10, 1, maxSketchBytes+1, make([]byte, maxSketchBytes+1))},
		{"trailing bytes", valid + "x"},
	}
	// Every truncation of a valid value is malformed too.
	for n := len(stamp); n < len(valid); n++ {
		tests = append(tests, struct{ name, value string }{"truncated to " + strconv.Itoa(n), valid[:n]})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, snaps, err := decodeField(tt.value); err == nil {
				t.Fatalf("decodeField accepted it: %d snapshots", len(snaps))
			}
		})
	}
}

// FuzzDecodeField checks that no input makes the decoder panic or return
// more than its bounds allow.
func FuzzDecodeField(f *testing.F) {
	f.Add(encodeField(t0, sampleSnapshots(f)))
	f.Add(encodeField(t0, nil))
	f.Add("1|\x01\x01\x02\x14")
	f.Fuzz(func(t *testing.T, v string) {
		_, snaps, err := decodeField(v)
		if err != nil {
			return
		}
		if len(snaps) > maxSnapshotsPerField {
			t.Fatalf("%d snapshots decoded", len(snaps))
		}
		for _, s := range snaps {
			if s.Width <= 0 || len(s.Sketch) > maxSketchBytes || !(s.Count >= 0) {
				t.Fatalf("snapshot out of bounds: %+v", s)
			}
		}
	})
}

func TestParseCohortKeyInvertsKeyAndRejectsAnythingElse(t *testing.T) {
	for _, c := range []delay.Cohort{
		chatStream,
		{Operation: "code/complete", Model: "a:b{c}", Stream: false, MaxTokens: 0},
		{Operation: "résumé", Model: "m%20", Stream: true, MaxTokens: 65536},
		{Operation: "default", Model: "text-embedding-3-small", Kind: delay.KindEmbeddings},
	} {
		got, err := delay.ParseCohortKey(c.Key())
		if err != nil || got != c {
			t.Fatalf("delay.ParseCohortKey(%q) = %+v, %v; want %+v", c.Key(), got, err, c)
		}
	}
	for _, k := range []string{
		"", "chat/gpt4o/stream", "chat/gpt4o/stream/mt64/x", "chat/gpt4o/maybe/mt64",
		"chat/gpt4o/stream/64", "chat/gpt4o/stream/mt7", "chat/gpt4o/stream/mt-64",
		"%zz/gpt4o/stream/mt64", "ch%61t/gpt4o/stream/mt64",
	} {
		if c, err := delay.ParseCohortKey(k); err == nil {
			t.Fatalf("delay.ParseCohortKey(%q) accepted it as %+v", k, c)
		}
	}
}
