package node

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

// TestRedisClientLogsInAsTheConfiguredACLUser: username and password_env
// reach Redis; a wrong password is refused by Redis, not ignored.
func TestRedisClientLogsInAsTheConfiguredACLUser(t *testing.T) {
	rs := redistest.Start(t, "--user", "hedgerow", "on", ">s3cret-pass", "~*", "&*", "+@all", "--user", "default", "off")
	tests := []struct {
		name, password string
		ok             bool
	}{
		{"the right password", "s3cret-pass", true},
		{"a wrong password", "guess", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"REDIS_PASSWORD": tt.password}
			c, err := redisClient(config.Redis{URL: rs.URL(), Username: "hedgerow", PasswordEnv: "REDIS_PASSWORD", Timeout: time.Second},
				func(k string) string { return env[k] })
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			err = c.Ping(t.Context()).Err()
			if (err == nil) != tt.ok {
				t.Fatalf("PING as hedgerow with %s: %v", tt.name, err)
			}
		})
	}
}

// TestRedisClientSpeaksTLSWithTheConfiguredCA: a TLS-only redis-server with a
// certificate from a test CA is reached with tls.ca_file; without the CA the
// handshake fails.
func TestRedisClientSpeaksTLSWithTheConfiguredCA(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := writeTestPKI(t, dir)
	port := freeTCPPort(t)
	redistest.Start(t, "--tls-port", strconv.Itoa(port), "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-ca-cert-file", caFile, "--tls-auth-clients", "no")
	url := "rediss://127.0.0.1:" + strconv.Itoa(port)
	tests := []struct {
		name string
		tls  config.RedisTLS
		ok   bool
	}{
		{"trusting the test CA", config.RedisTLS{Enabled: true, CAFile: caFile}, true},
		{"trusting only the system's roots", config.RedisTLS{Enabled: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := redisClient(config.Redis{URL: url, TLS: tt.tls, Timeout: time.Second}, func(string) string { return "" })
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = c.Ping(ctx).Err()
			if (err == nil) != tt.ok {
				t.Fatalf("PING over TLS %s: %v", tt.name, err)
			}
		})
	}
}

// writeTestPKI writes a CA and a server certificate for 127.0.0.1 signed by
// it, in PEM, and returns their paths.
func writeTestPKI(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hedgerow test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srv := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server.key", "EC PRIVATE KEY", keyDER)
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
