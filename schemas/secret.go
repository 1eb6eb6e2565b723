package schemas

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
)

// SecretBytes is the entropy of an attempt's secret: 128 bits, written as
// 32 lowercase hex digits.
const SecretBytes = 16

// NewAttemptSecret returns a fresh attempt secret from crypto/rand
// (docs/architecture.md §8). It is a bearer token: whoever reads the
// attempt can present it, so it proves only that a reply or cancel comes
// from someone who saw the attempt, never who that is.
func NewAttemptSecret() (string, error) {
	var b [SecretBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("schemas: attempt secret: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// SameSecret reports whether got is the secret want, in time that does not
// depend on where they differ. Two empty secrets are the same: an attempt
// of a gateway that predates secrets carries none.
func SameSecret(want, got string) bool {
	return subtle.ConstantTimeCompare([]byte(want), []byte(got)) == 1
}
