package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// serveStore is the JetStream directory a serve process keeps its state
// in, held for as long as the process runs.
type serveStore struct {
	dir string
	// unlock releases the directory; remove also deletes it (a temporary
	// directory, for an http.listen whose port is chosen at start).
	unlock func()
	remove bool
}

// Close releases the directory and deletes it when it was temporary.
func (s *serveStore) Close() {
	s.unlock()
	if s.remove {
		_ = os.RemoveAll(s.dir)
	}
}

// errStoreHeld is wrapped when another serve holds the directory.
var errStoreHeld = errors.New("held by another hedgerow serve")

// storeLockFile is the file in a store directory serve holds a lock on.
const storeLockFile = "serve.lock"

// openServeStore returns the JetStream directory of a serve: storeDir when
// the configuration names one, else its default, one per HTTP address
// (defaultStoreDir). Either way it takes an exclusive lock on it first, so
// that a second serve on the same directory refuses before it starts a NATS
// server on files another one is writing.
func openServeStore(storeDir, httpListen string) (*serveStore, error) {
	st := &serveStore{dir: storeDir}
	if st.dir == "" {
		var err error
		if st.dir, st.remove, err = defaultStoreDir(httpListen); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(st.dir, 0o700); err != nil {
		return nil, fmt.Errorf("nats.store_dir %s: %w", st.dir, err)
	}
	unlock, holder, err := lockDir(filepath.Join(st.dir, storeLockFile))
	if errors.Is(err, errStoreHeld) {
		if st.remove {
			_ = os.RemoveAll(st.dir)
		}
		return nil, fmt.Errorf("JetStream store %s is %w (pid %s): stop it first, or give this one "+
			"another http.listen (the default store is one per HTTP address) or its own nats.store_dir", st.dir, err, holder)
	}
	if err != nil {
		return nil, fmt.Errorf("JetStream store %s: %w", st.dir, err)
	}
	st.unlock = unlock
	return st, nil
}

// temporaryStorePrefix starts the name of a temporary store directory.
const temporaryStorePrefix = "port-0-"

// sweepTemporaryStores removes the temporary store directories under parent
// that no serve holds: those of serves killed before they could remove them.
// A directory younger than a minute is left alone: its serve may not have
// locked it yet.
func sweepTemporaryStores(parent string) {
	dirs, _ := filepath.Glob(filepath.Join(parent, temporaryStorePrefix+"*"))
	for _, dir := range dirs {
		if st, err := os.Stat(dir); err != nil || time.Since(st.ModTime()) < time.Minute {
			continue
		}
		if unlock, _, err := lockDir(filepath.Join(dir, storeLockFile)); err == nil {
			_ = os.RemoveAll(dir)
			unlock()
		}
	}
}

// defaultStoreDir is where serve keeps its embedded JetStream's state when
// nats.store_dir is empty: hedgerow/nats/HOST-PORT under the user's state
// directory ($XDG_STATE_HOME, else ~/.local/state), HOST-PORT being its
// http.listen. The HTTP address is what a serve's clients know it by and
// what no two running serves share, so a restart of one serve finds its
// state again (the winner gate's ledger outlives it) while another serve on
// another address keeps its own. When the port is chosen at start (0),
// there is no address to come back to: the directory is a temporary one
// under hedgerow/nats, removed at stop (temporary is true).
func defaultStoreDir(httpListen string) (dir string, temporary bool, err error) {
	base := os.Getenv("XDG_STATE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", false, fmt.Errorf("nats.store_dir is empty and there is no home directory to keep state under: %w", err)
		}
		base = filepath.Join(home, ".local", "state")
	}
	parent := filepath.Join(base, "hedgerow", "nats")
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", false, fmt.Errorf("JetStream store %s: %w", parent, err)
	}
	host, port, err := net.SplitHostPort(httpListen)
	if err != nil {
		return "", false, fmt.Errorf("http.listen %q: %w", httpListen, err)
	}
	if p, err := strconv.Atoi(port); err == nil && p == 0 {
		sweepTemporaryStores(parent)
		dir, err := os.MkdirTemp(parent, temporaryStorePrefix)
		if err != nil {
			return "", false, fmt.Errorf("JetStream store under %s: %w", parent, err)
		}
		return dir, true, nil
	}
	if host == "" {
		host = "any"
	}
	dir = filepath.Join(parent, strings.NewReplacer(":", "_", "/", "_", "%", "_").Replace(host)+"-"+port)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", false, fmt.Errorf("JetStream store %s: %w", dir, err)
	}
	return dir, false, nil
}
