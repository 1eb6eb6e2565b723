package config

import (
	"fmt"
	"time"
)

// SyncInterval is how often serve's embedded JetStream writes its files to
// disk (nats-server's `sync_interval`, docs/architecture.md §6
// "Durability"). In YAML it is "always" — every write is fsynced before it
// is acknowledged, the default — or a positive duration such as "2m",
// nats-server's own default, which acknowledges writes an OS crash can
// still lose. Its zero value is "always".
type SyncInterval time.Duration

// SyncAlways is the text form of the zero SyncInterval.
const SyncAlways = "always"

// UnmarshalText parses "always" or a positive duration.
func (s *SyncInterval) UnmarshalText(text []byte) error {
	if string(text) == SyncAlways {
		*s = 0
		return nil
	}
	d, err := time.ParseDuration(string(text))
	if err != nil || d <= 0 {
		return fmt.Errorf("%q is neither %q nor a positive duration such as \"2m\"", text, SyncAlways)
	}
	*s = SyncInterval(d)
	return nil
}

// String is "always" or the duration.
func (s SyncInterval) String() string {
	if s == 0 {
		return SyncAlways
	}
	return time.Duration(s).String()
}
