package schemas

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxModelNameLen bounds a model name a pool answers to (an alias, see
// CheckModelName) and the model a caller may send over the NATS door.
const MaxModelNameLen = 256

// ErrInvalidModelName is wrapped by CheckModelName's errors.
var ErrInvalidModelName = errors.New("schemas: invalid model name")

// CheckModelName checks a model name a pool answers to besides its own
// (docs/architecture.md §10, pools.*.models): any name a provider uses, such
// as "gpt-4o-2024-08-06", "claude-3.5-sonnet" or "meta-llama/Llama-3-70b",
// as long as it is valid UTF-8 of 1 to MaxModelNameLen bytes with no control
// characters and no leading or trailing white space. Such a name is only
// ever compared; it never becomes a NATS subject, a Redis key or a metric
// label, which use the pool's own name.
func CheckModelName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrInvalidModelName)
	case len(name) > MaxModelNameLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidModelName, len(name), MaxModelNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidModelName)
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: contains the control character %U", ErrInvalidModelName, r)
		}
	}
	first, _ := utf8.DecodeRuneInString(name)
	last, _ := utf8.DecodeLastRuneInString(name)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return fmt.Errorf("%w: leading or trailing white space", ErrInvalidModelName)
	}
	return nil
}
