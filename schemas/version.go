package schemas

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// Version is the major version of every wire message and record this binary
// speaks. Additive, backward-compatible changes keep it; anything a version-1
// reader would misread raises it, and readers reject what they cannot read.
const Version = 1

// VersionError reports the major version a message carried; it matches
// ErrUnsupportedVersion. Seen is 0 when the message had no "v" at all.
type VersionError struct {
	Seen int
}

// Error names the version seen and the one wanted.
func (e *VersionError) Error() string {
	if e.Seen == 0 {
		return fmt.Sprintf("%v: message has no \"v\" or v=0 (want %d)", ErrUnsupportedVersion, Version)
	}
	return fmt.Sprintf("%v: v=%d (want %d)", ErrUnsupportedVersion, e.Seen, Version)
}

// Is makes errors.Is(err, ErrUnsupportedVersion) hold.
func (e *VersionError) Is(target error) bool { return target == ErrUnsupportedVersion }

// Decode reads the "v" field of data first and returns a *VersionError unless
// it is Version; only then is data decoded into v. Unknown fields are ignored
// so that additive changes within a major version stay readable; the JSON
// Schema files (see Validate) are the strict definition.
//
// A message whose top level plainly says "v":1 is decoded in one pass (see
// peekHead); any other goes the careful way, version first, so every error
// is the same either way.
func Decode(data []byte, v any) error {
	if _, ok := peekHead(data); ok && json.Unmarshal(data, v) == nil {
		return nil
	}
	return decodeCarefully(data, v)
}

// decodeCarefully is Decode without the fast path: the version check, then
// the decode, each a pass of its own.
func decodeCarefully(data []byte, v any) error {
	if err := checkVersion(data); err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	return nil
}

// peekHead looks at the top-level keys of a message, without decoding it,
// for the two that every message is read by: "v" and the reply "type". It
// reports ok only when the answer is plain: the top level is an object, "v"
// appears once, spelled exactly, as the literal 1 (Version), "type" appears
// at most once, as a string without escapes, and no other key is an escaped
// or case-folded spelling of either (encoding/json would match those too).
// typ is the "type" string, nil when absent.
//
// It does not validate the rest of the document: a caller decodes it with
// encoding/json next, which does, and on any error goes the careful way. On
// valid JSON the top-level keys it finds are exactly those encoding/json
// finds, so when ok, "v" is Version as checkVersion would read it.
func peekHead(data []byte) (typ []byte, ok bool) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return nil, false
	}
	i++
	sawV, sawType := false, false
	for {
		i = skipSpace(data, i)
		if i >= len(data) {
			return nil, false
		}
		if data[i] != '"' {
			return nil, false
		}
		end, escaped := stringEnd(data, i)
		if end < 0 || escaped {
			return nil, false
		}
		key := data[i+1 : end-1]
		i = skipSpace(data, end)
		if i >= len(data) || data[i] != ':' {
			return nil, false
		}
		i = skipSpace(data, i+1)
		valStart := i
		if i = valueEnd(data, i); i < 0 {
			return nil, false
		}
		val := data[valStart:i]
		switch {
		case string(key) == "v":
			if sawV || string(bytes.TrimRight(val, " \t\r\n")) != strconv.Itoa(Version) {
				return nil, false
			}
			sawV = true
		case string(key) == "type":
			val = bytes.TrimRight(val, " \t\r\n")
			if sawType || len(val) < 2 || val[0] != '"' {
				return nil, false
			}
			if end, esc := stringEnd(val, 0); esc || end != len(val) {
				return nil, false
			}
			typ, sawType = val[1:len(val)-1], true
		case bytes.EqualFold(key, []byte("v")), bytes.EqualFold(key, []byte("type")):
			return nil, false
		}
		i = skipSpace(data, i)
		if i >= len(data) {
			return nil, false
		}
		switch data[i] {
		case ',':
			i++
		case '}':
			return typ, sawV
		default:
			return nil, false
		}
	}
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the string starting at data[i] (a
// quote), or -1 if it is not closed, and whether it holds escapes.
func stringEnd(data []byte, i int) (end int, escaped bool) {
	for j := i + 1; ; {
		k := bytes.IndexByte(data[j:], '"')
		if k < 0 {
			return -1, escaped
		}
		q := j + k
		if bytes.IndexByte(data[j:q], '\\') < 0 {
			return q + 1, escaped
		}
		escaped = true
		// The quote closes the string unless an odd run of backslashes
		// escapes it.
		n := 0
		for p := q - 1; p >= j && data[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, escaped
		}
		j = q + 1
	}
}

// valueEnd returns the index just past the value starting at data[i], or
// -1 if none ends there. Nested values are skipped by their brackets.
func valueEnd(data []byte, i int) int {
	depth := 0
	for i < len(data) {
		switch c := data[i]; c {
		case '"':
			end, _ := stringEnd(data, i)
			if end < 0 {
				return -1
			}
			i = end
			if depth == 0 {
				return i
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i // the end of a scalar before the object closes
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',':
			if depth == 0 {
				return i
			}
		}
		i++
	}
	if depth == 0 {
		return i
	}
	return -1
}

// checkVersion peeks at the "v" field without decoding the rest.
func checkVersion(data []byte) error {
	var head struct {
		V json.RawMessage `json:"v"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return fmt.Errorf("decode version: %w", err)
	}
	if len(head.V) == 0 || string(head.V) == "null" {
		return &VersionError{Seen: 0}
	}
	n, err := strconv.Atoi(string(head.V))
	if err != nil {
		return fmt.Errorf("%w: \"v\" is %s, not an integer", ErrUnsupportedVersion, head.V)
	}
	if n != Version {
		return &VersionError{Seen: n}
	}
	return nil
}

// stampVersion returns the version to write for a message whose V field is v:
// a zero V means "the version this binary speaks", so callers never have to
// set it; a non-zero V is written as given.
func stampVersion(v int) int {
	if v == 0 {
		return Version
	}
	return v
}
