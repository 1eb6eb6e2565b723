package upstream

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

// event is one Server-Sent Event, as a test reads it: its type ("" unless an "event:" field set
// one) and its data lines joined by newlines.
type event struct {
	typ  string
	data string
}

// next is nextBytes with copies, for tests that collect events.
func (r *eventReader) next() (event, error) {
	typ, data, err := r.nextBytes()
	if err != nil {
		return event{}, err
	}
	return event{typ: string(typ), data: string(data)}, nil
}

func TestEventReaderFollowsTheEventStreamFormat(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []event
	}{
		{"one event per blank line", "data: a\n\ndata: b\n\n", []event{{data: "a"}, {data: "b"}}},
		{"data lines of one event are joined by newlines", "data: {\ndata: \"k\":1}\n\n", []event{{data: "{\n\"k\":1}"}}},
		{"comments are skipped", ": ping\n\ndata: a\n: in between\n\n", []event{{data: "a"}}},
		{"only one leading space is stripped", "data:  a\ndata:b\n\n", []event{{data: " a\nb"}}},
		{"a field without a colon is an empty value", "data\n\n", []event{{data: ""}}},
		{"event sets the type of its event only", "event: error\ndata: x\n\ndata: y\n\n", []event{{typ: "error", data: "x"}, {data: "y"}}},
		{"id and retry are ignored", "id: 7\nretry: 100\ndata: a\n\n", []event{{data: "a"}}},
		{"CRLF and CR end lines", "data: a\r\n\r\ndata: b\r\rdata: c\r\n\n", []event{{data: "a"}, {data: "b"}, {data: "c"}}},
		{"an event cut by the end of the body is discarded", "data: a\n\ndata: {\"partial", []event{{data: "a"}}},
		{"an event without its blank line is discarded", "data: a\n\ndata: b\n", []event{{data: "a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newEventReader(strings.NewReader(tc.in))
			var got []event
			for {
				ev, err := r.next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("next: %v", err)
				}
				got = append(got, ev)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("events = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// oneByteReader returns one byte per Read, so a CR and its LF arrive in
// different reads.
type oneByteReader struct{ s string }

func (r *oneByteReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	p[0] = r.s[0]
	r.s = r.s[1:]
	return 1, nil
}

func TestCRLFSplitAcrossReadsIsOneLineEnd(t *testing.T) {
	r := newEventReader(&oneByteReader{s: "data: a\r\n\r\ndata: b\r\n\r\n"})
	var got []event
	for {
		ev, err := r.next()
		if err != nil {
			break
		}
		got = append(got, ev)
	}
	if want := []event{{data: "a"}, {data: "b"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("events = %+v, want %+v", got, want)
	}
}
