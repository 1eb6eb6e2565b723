package upstream

import (
	"bufio"
	"bytes"
	"io"
	"strings"
)

// MaxEventBytes bounds one line of a provider's event stream. Chat chunks
// are a few hundred bytes; a longer line means a broken or hostile stream.
const MaxEventBytes = 1 << 20

// event is one Server-Sent Event: its type ("" unless an "event:" field set
// one) and its data lines joined by newlines.
type event struct {
	typ  string
	data string
}

// eventReader splits a Server-Sent Events body into events, following the
// WHATWG event-stream format: lines end in CRLF, LF or CR; lines starting
// with ':' are comments; "data" fields accumulate; a blank line dispatches.
type eventReader struct {
	lines *bufio.Scanner
}

func newEventReader(r io.Reader) *eventReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), MaxEventBytes)
	sc.Split(splitLines)
	return &eventReader{lines: sc}
}

// next returns the next event with data. At the end of the body it returns
// io.EOF; an event not ended by a blank line is discarded, as the format
// requires, so a stream cut inside an event never yields half a chunk.
func (r *eventReader) next() (event, error) {
	var (
		typ     string
		data    strings.Builder
		hasData bool
	)
	for r.lines.Scan() {
		line := r.lines.Bytes()
		if len(line) == 0 {
			if hasData {
				return event{typ: typ, data: strings.TrimSuffix(data.String(), "\n")}, nil
			}
			typ = ""
			continue
		}
		if line[0] == ':' {
			continue // comment: a keep-alive such as ": ping"
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "data":
			data.Write(value)
			data.WriteByte('\n')
			hasData = true
		case "event":
			typ = string(value)
		}
		// "id" and "retry" serve reconnection, which one attempt never does.
	}
	if err := r.lines.Err(); err != nil {
		return event{}, err
	}
	return event{}, io.EOF
}

// splitLines is a bufio.SplitFunc for CRLF, LF and lone CR line endings.
func splitLines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	i := bytes.IndexAny(data, "\r\n")
	switch {
	case i < 0:
		if atEOF && len(data) > 0 {
			return len(data), data, nil
		}
		return 0, nil, nil
	case data[i] == '\n':
		return i + 1, data[:i], nil
	case i+1 < len(data):
		if data[i+1] == '\n' {
			return i + 2, data[:i], nil
		}
		return i + 1, data[:i], nil
	case atEOF:
		return i + 1, data[:i], nil
	}
	return 0, nil, nil // a CR at the end of the buffer: wait to see if LF follows
}
