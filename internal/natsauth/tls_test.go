package natsauth

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// startTLSServer writes a bundle with TLS into a temporary directory and
// runs a nats-server in process on the generated configuration.
func startTLSServer(t *testing.T) (string, *Bundle, *server.Server) {
	t.Helper()
	sp := spec()
	sp.TLS = &TLSSpec{ServerNames: []string{"nats.internal", "10.0.0.7"}}
	b, err := Generate(sp)
	if err != nil {
		t.Fatal(err)
	}
	dir, opts := writeAndLoad(t, b)
	if opts.TLSConfig == nil || opts.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Fatalf("the generated configuration does not require verified client certificates: %+v", opts.TLSConfig)
	}
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return dir, b, s
}

func TestTheServerCertificateAnswersToLoopbackAndTheGivenNames(t *testing.T) {
	b, err := GenerateTLS(TLSSpec{ServerNames: []string{"nats.internal", "10.0.0.7"}}, []string{"gateway"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(b.Files[CAFile]) {
		t.Fatal("the CA file holds no certificate")
	}
	parse := func(name string) *x509.Certificate {
		blk, _ := pem.Decode(b.Files[name])
		if blk == nil {
			t.Fatalf("%s holds no PEM block", name)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	srv := parse(ServerCertFile)
	for _, name := range []string{"127.0.0.1", "localhost", "nats.internal", "10.0.0.7"} {
		if _, err := srv.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
			t.Errorf("server certificate for %s: %v", name, err)
		}
	}
	if _, err := srv.Verify(x509.VerifyOptions{DNSName: "elsewhere.example", Roots: roots}); err == nil {
		t.Error("the server certificate verifies for a name it was not made for")
	}
	client := parse(ClientCertFile("gateway"))
	if client.Subject.CommonName != "gateway" {
		t.Errorf("client certificate names %q, want gateway", client.Subject.CommonName)
	}
	if _, err := client.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate: %v", err)
	}
}

func TestAUserConnectsOverTLSOnlyWithItsCertificateAndItsSecret(t *testing.T) {
	dir, _, s := startTLSServer(t)
	tdir := filepath.Join(dir, TLSDir)
	url := s.ClientURL()
	seed := func(user string) nats.Option {
		o, err := nats.NkeyOptionFromSeed(filepath.Join(dir, user+".nk"))
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	ca := nats.RootCAs(filepath.Join(tdir, CAFile))
	cert := func(user string) nats.Option {
		return nats.ClientCert(filepath.Join(tdir, ClientCertFile(user)), filepath.Join(tdir, ClientKeyFile(user)))
	}
	other, err := GenerateTLS(TLSSpec{}, []string{"gateway"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	odir := t.TempDir()
	for name, data := range other.Files {
		if err := os.WriteFile(filepath.Join(odir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		opts []nats.Option
		ok   bool
	}{
		{"certificate and nkey", []nats.Option{ca, cert("gateway"), seed("gateway")}, true},
		{"nkey without a certificate", []nats.Option{ca, seed("gateway")}, false},
		{"certificate without an nkey", []nats.Option{ca, cert("gateway")}, false},
		{"a certificate another CA signed", []nats.Option{ca, seed("gateway"),
			nats.ClientCert(filepath.Join(odir, ClientCertFile("gateway")), filepath.Join(odir, ClientKeyFile("gateway")))}, false},
		{"plain text", []nats.Option{seed("gateway")}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc, err := nats.Connect(url, append(tt.opts, nats.Timeout(5*time.Second), nats.NoReconnect())...)
			if nc != nil {
				defer nc.Close()
			}
			if (err == nil) != tt.ok {
				t.Fatalf("connect: %v; want success %v", err, tt.ok)
			}
			if err == nil {
				if err := nc.Flush(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestTLSFilesAreWrittenPrivately(t *testing.T) {
	dir, b, _ := startTLSServer(t)
	for name := range b.TLS.Files {
		fi, err := os.Stat(filepath.Join(dir, TLSDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", name, fi.Mode().Perm())
		}
	}
	if err := b.Write(dir); err == nil {
		t.Error("a second Write overwrote the files")
	}
}
