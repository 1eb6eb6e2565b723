// Package embednats runs the NATS server that `hedgerow serve` embeds
// (docs/architecture.md §2): gateway and workers of one process talk through it over
// in-process connections, so the all-in-one mode needs no port and no
// separate server. On request it also listens on a TCP address, so workers
// of other processes can join it.
//
// The server is quiet (its notices are debug logs), handles no signals —
// the process that embeds it owns them — and is started with the
// configuration's max_payload, which must cover the HTTP body limit plus the
// attempt envelope (docs/architecture.md §8).
package embednats

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// DefaultServerName names the embedded server in its INFO and monitoring.
const DefaultServerName = "hedgerow-embedded"

// readyTimeout bounds the wait for the server to accept connections; a
// listener that cannot bind (address in use) is reported after it.
const readyTimeout = 5 * time.Second

// ErrInvalidOptions is matched by every error Start returns for bad Options.
var ErrInvalidOptions = errors.New("embednats: invalid options")

// Options configures the embedded server.
type Options struct {
	// Listen is the client address "host:port" to accept TCP clients on;
	// port 0 picks a free one. Empty keeps the server in-process only: it
	// opens no port and only Connect reaches it.
	Listen string
	// MaxPayload is the largest message the server accepts, in bytes; it
	// must be positive and at most 64 MiB, the server's own ceiling.
	MaxPayload int64
	// ServerName names the server; empty means DefaultServerName.
	ServerName string
	// ConfigFile is a nats-server configuration file (as `hedgerow
	// nats-auth` writes it) whose users, permissions and TLS the server
	// takes; listen address, max payload, name and signals stay this
	// Options's. Empty: no users, which Start allows only without Listen.
	ConfigFile string
	// StoreDir enables JetStream, keeping its state (the winner gate's
	// ledger) in this directory; empty runs the server without JetStream.
	StoreDir string
	// SyncInterval is how often JetStream fsyncs its files; zero fsyncs
	// every write before acknowledging it (nats-server's `sync_interval:
	// always`), which an OS crash cannot undo (docs/architecture.md §6,
	// "Durability"). nats-server's own default is 2 minutes.
	SyncInterval time.Duration
	// Logger receives the server's logs: notices at debug level, warnings
	// and errors as such. Nil discards them.
	Logger *slog.Logger
}

// maxPayloadCeiling is the default max_pending of nats-server, which a
// max_payload must not exceed.
const maxPayloadCeiling = 64 << 20

// ErrOpenListener: a listener was asked for with no users, which would let
// anyone who reaches the port onto the bus (docs/architecture.md §13).
var ErrOpenListener = errors.New("a TCP listener needs users: give a ConfigFile with an authorization block")

// hasUsers reports whether opts authenticate clients.
func hasUsers(o *server.Options) bool {
	return len(o.Users) > 0 || len(o.Nkeys) > 0 || o.Username != "" || o.Authorization != "" ||
		len(o.TrustedOperators) > 0 || len(o.TrustedKeys) > 0 || o.CustomClientAuthentication != nil
}

// Server is a running embedded NATS server.
type Server struct {
	ns         *server.Server
	listen     bool
	maxPayload int64
}

// Start starts a server for cfg and returns once it accepts connections.
func Start(cfg Options) (*Server, error) {
	if cfg.MaxPayload <= 0 || cfg.MaxPayload > maxPayloadCeiling {
		return nil, fmt.Errorf("%w: max payload %d is outside (0, %d]", ErrInvalidOptions, cfg.MaxPayload, maxPayloadCeiling)
	}
	name := cfg.ServerName
	if name == "" {
		name = DefaultServerName
	}
	opts := &server.Options{}
	if cfg.ConfigFile != "" {
		var err error
		if opts, err = server.ProcessConfigFile(cfg.ConfigFile); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidOptions, err)
		}
	}
	opts.ServerName = name
	opts.MaxPayload = int32(cfg.MaxPayload)
	if cfg.StoreDir != "" {
		opts.JetStream, opts.StoreDir = true, cfg.StoreDir
		opts.SyncInterval, opts.SyncAlways = cfg.SyncInterval, cfg.SyncInterval == 0
	}
	opts.NoSigs = true
	// The server runs no accept loop without a listen address; the
	// in-process connections of Connect are its only clients.
	opts.DontListen = cfg.Listen == ""
	if cfg.Listen != "" {
		host, port, err := splitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("%w: listen %q: %v", ErrInvalidOptions, cfg.Listen, err)
		}
		if !hasUsers(opts) {
			return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, ErrOpenListener)
		}
		opts.Host, opts.Port = host, port
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	sl := &slogLogger{log: logger.With("component", "nats-server")}
	ns.SetLoggerV2(sl, false, false, false)
	go ns.Start()
	if err := waitReady(ns, sl); err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	return &Server{ns: ns, listen: cfg.Listen != "", maxPayload: cfg.MaxPayload}, nil
}

// waitReady waits until ns accepts connections, returning early with the
// server's own words when it reports a fatal error (an address in use).
func waitReady(ns *server.Server, sl *slogLogger) error {
	deadline := time.Now().Add(readyTimeout)
	for !ns.ReadyForConnections(50 * time.Millisecond) {
		if msg := sl.fatal(); msg != "" {
			return errors.New(msg)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready for connections after %v", readyTimeout)
		}
	}
	return nil
}

// splitHostPort parses "host:port", mapping port 0 to the server's
// "pick a free port" value.
func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q is not a number in [0, 65535]", p)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}

// Connect opens a client connection to the server through memory, whether
// or not it listens on TCP. name is the client name the server reports;
// opts are applied after the in-process dialer.
func (s *Server) Connect(name string, opts ...nats.Option) (*nats.Conn, error) {
	all := append([]nats.Option{nats.InProcessServer(s.ns), nats.Name(name)}, opts...)
	nc, err := nats.Connect("", all...)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: connect %s: %w", name, err)
	}
	return nc, nil
}

// ClientURL is the nats:// URL other processes connect to, or empty when the
// server is in-process only.
func (s *Server) ClientURL() string {
	if !s.listen {
		return ""
	}
	return s.ns.ClientURL()
}

// MaxPayload is the largest message the server accepts.
func (s *Server) MaxPayload() int64 { return s.maxPayload }

// Shutdown closes every client connection and stops the server, returning
// when all its goroutines have ended. It is idempotent.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}

// slogLogger routes the server's logs to slog. Its notices (startup banner,
// client churn) are debug logs, so the embedding process stays quiet.
type slogLogger struct {
	log       *slog.Logger
	lastFatal atomic.Pointer[string]
}

func (l *slogLogger) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *slogLogger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *slogLogger) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *slogLogger) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *slogLogger) Tracef(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }

// Fatalf is logged as an error and remembered: an embedded server must
// never end the process that hosts it, and Start reports what failed.
func (l *slogLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.lastFatal.Store(&msg)
	l.log.Error(msg)
}

// fatal returns the last fatal message, or empty.
func (l *slogLogger) fatal() string {
	if p := l.lastFatal.Load(); p != nil {
		return *p
	}
	return ""
}
