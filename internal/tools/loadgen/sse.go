package loadgen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// maxEventLine bounds one line of a stream; a chunk is far smaller.
const maxEventLine = 1 << 20

// streamStats is what a chat completion stream measured.
type streamStats struct {
	firstToken time.Duration // zero: no content or tool-call token arrived
	chunks     int
	done       bool
}

// readStream reads a chat completion stream of server-sent events to its
// end. since is read when the first content or tool-call token is parsed.
// The stream is complete only with "data: [DONE]"; an error event ends it
// with a *StreamError.
func readStream(r io.Reader, since func() time.Duration) (streamStats, error) {
	var (
		st   streamStats
		data bytes.Buffer // the data lines of the event being read
		has  bool         // the event has a data field
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxEventLine)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 { // a blank line dispatches the event
			if has {
				if err := st.event(data.Bytes(), since); err != nil {
					return st, err
				}
				if st.done {
					return st, nil
				}
			}
			data.Reset()
			has = false
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		if len(field) == 0 {
			continue // a comment, e.g. a keep-alive
		}
		if string(field) != "data" {
			continue // event, id and retry fields say nothing about the answer
		}
		value = bytes.TrimPrefix(value, []byte(" "))
		if has {
			data.WriteByte('\n')
		}
		data.Write(value)
		has = true
	}
	if err := sc.Err(); err != nil {
		return st, fmt.Errorf("read stream: %w", err)
	}
	// A last event without its blank line still counts (the stream ended).
	if has {
		if err := st.event(data.Bytes(), since); err != nil {
			return st, err
		}
	}
	if !st.done {
		return st, ErrIncomplete
	}
	return st, nil
}

// event handles one event's data.
func (st *streamStats) event(data []byte, since func() time.Duration) error {
	if bytes.Equal(bytes.TrimSpace(data), []byte("[DONE]")) {
		st.done = true
		return nil
	}
	var ev struct {
		errorBody
		Choices []struct {
			Delta struct {
				Content   string          `json:"content"`
				ToolCalls json.RawMessage `json:"tool_calls"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		return fmt.Errorf("read stream: undecodable event: %w", err)
	}
	if ev.Error != nil {
		e := &StreamError{Message: ev.Error.Message}
		if ev.Error.Code != nil {
			e.Code = *ev.Error.Code
		}
		return e
	}
	for _, c := range ev.Choices {
		if c.Delta.Content == "" && !schemas.HasToolCalls(c.Delta.ToolCalls) {
			continue
		}
		st.chunks++
		if st.firstToken == 0 {
			st.firstToken = max(since(), 1) // nonzero: zero means none
		}
		break
	}
	return nil
}
