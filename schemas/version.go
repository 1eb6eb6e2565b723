package schemas

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Version is the major version of every wire message and record this binary
// speaks. Additive, backward-compatible changes keep it; anything a version-1
// reader would misread raises it, and readers reject what they cannot read.
const Version = 1

// ErrUnsupportedVersion is matched (errors.Is) by every error reporting a
// message whose major version this binary does not speak.
var ErrUnsupportedVersion = errors.New("unsupported major version")

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
func Decode(data []byte, v any) error {
	if err := checkVersion(data); err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	return nil
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
