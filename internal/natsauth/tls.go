package natsauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// TLS of a deployment (docs/architecture.md §13): a CA of its own, one
// server certificate every NATS server presents (to clients and to the
// other servers of its cluster) and one client certificate per user, all
// ECDSA P-256 made with crypto/x509 alone. The servers require a client
// certificate the CA signed (verify), and each user still authenticates
// with its own secret, which decides its permissions: a certificate admits
// a connection, the user's nkey or password names the role.
//
// The files go in the TLSDir subdirectory of the bundle's directory; the
// server configuration includes TLSServerConfigFile, which names them by
// absolute path.
const (
	// TLSDir is the subdirectory of the certificates and keys.
	TLSDir = "tls"
	// TLSServerConfigFile is the server's tls block, included from
	// ServerConfigFile.
	TLSServerConfigFile = "nats-server-tls.conf"
	// CAFile, ServerCertFile and ServerKeyFile name the CA's certificate
	// and the servers' certificate and key in TLSDir.
	CAFile         = "ca.pem"
	ServerCertFile = "server.pem"
	ServerKeyFile  = "server-key.pem"
	// DefaultTLSValidity is how long generated certificates are valid.
	DefaultTLSValidity = 365 * 24 * time.Hour
)

// ClientCertFile and ClientKeyFile name user's certificate and key in TLSDir.
func ClientCertFile(user string) string { return user + ".pem" }

// ClientKeyFile names user's key in TLSDir.
func ClientKeyFile(user string) string { return user + "-key.pem" }

// TLSSpec asks for TLS material: the names the server certificate answers
// to besides 127.0.0.1 and localhost (host names or IP addresses).
type TLSSpec struct {
	ServerNames []string
	// Validity defaults to DefaultTLSValidity.
	Validity time.Duration
	// CA, when set, signs the certificates instead of a new CA: the
	// deployment's CA, so that every region's servers trust each other's
	// gateway links (ReadCA reads it from an earlier bundle's directory).
	CA *CA
}

// CA is a certificate authority's certificate and key, PEM encoded.
type CA struct {
	CertPEM, KeyPEM []byte
}

// CAKeyFile names the CA's key in TLSDir. Only a bundle with gateway links
// whose CA it made keeps it (0600): the key signs the next region's
// certificates (nats-auth --from). No server reads it; keep it off the
// servers' hosts once every region is generated.
const CAKeyFile = "ca-key.pem"

// ReadCA reads the CA of an earlier bundle written in dir (its TLSDir's
// CAFile and CAKeyFile).
func ReadCA(dir string) (*CA, error) {
	cert, err := os.ReadFile(filepath.Join(dir, TLSDir, CAFile))
	if err != nil {
		return nil, fmt.Errorf("natsauth: the deployment's CA: %w", err)
	}
	key, err := os.ReadFile(filepath.Join(dir, TLSDir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("natsauth: the deployment's CA key (written with the first region's gateway links): %w", err)
	}
	return &CA{CertPEM: cert, KeyPEM: key}, nil
}

// TLSBundle is generated TLS material, PEM encoded: file name (in TLSDir)
// to contents.
type TLSBundle struct {
	Files map[string][]byte
	// CAKey is the key of a CA made here (nil when TLSSpec.CA signed),
	// written as CAKeyFile only with gateway links.
	CAKey []byte
}

// GenerateTLS makes a CA, a server certificate for 127.0.0.1, localhost
// and spec.ServerNames, and a client certificate for each user (its common
// name the user's name), valid from now.
func GenerateTLS(spec TLSSpec, users []string, now time.Time) (*TLSBundle, error) {
	validity := spec.Validity
	if validity <= 0 {
		validity = DefaultTLSValidity
	}
	notBefore, notAfter := now.Add(-time.Hour), now.Add(validity)
	var (
		b     *TLSBundle
		ca    *x509.Certificate
		caKey *ecdsa.PrivateKey
		err   error
	)
	if spec.CA != nil {
		if ca, caKey, err = spec.CA.parse(); err != nil {
			return nil, err
		}
		b = &TLSBundle{Files: map[string][]byte{CAFile: spec.CA.CertPEM}}
	} else if b, ca, caKey, err = newCA(notBefore, notAfter); err != nil {
		return nil, err
	}
	leaf := func(name string, tmpl *x509.Certificate) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = serial(), notBefore, notAfter
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		b.Files[name+".pem"] = pemBlock("CERTIFICATE", der)
		b.Files[name+"-key.pem"] = pemBlock("EC PRIVATE KEY", keyDER)
		return nil
	}
	server := &x509.Certificate{
		Subject: pkix.Name{CommonName: "hedgerow NATS server", Organization: []string{"hedgerow"}},
		// Servers are clients of each other on their cluster routes.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:    []string{"localhost"},
	}
	for _, n := range spec.ServerNames {
		if ip := net.ParseIP(n); ip != nil {
			server.IPAddresses = append(server.IPAddresses, ip)
		} else if n != "" && !slices.Contains(server.DNSNames, n) {
			server.DNSNames = append(server.DNSNames, n)
		}
	}
	if err := leaf(strings.TrimSuffix(ServerCertFile, ".pem"), server); err != nil {
		return nil, fmt.Errorf("natsauth: tls: server: %w", err)
	}
	for _, u := range users {
		if !userName.MatchString(u) || u == "server" || u == "ca" {
			return nil, fmt.Errorf("natsauth: tls: user name %q cannot name a certificate", u)
		}
		client := &x509.Certificate{
			Subject:     pkix.Name{CommonName: u, Organization: []string{"hedgerow"}},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		if err := leaf(u, client); err != nil {
			return nil, fmt.Errorf("natsauth: tls: user %s: %w", u, err)
		}
	}
	return b, nil
}

// newCA makes a CA valid from notBefore to notAfter.
func newCA(notBefore, notAfter time.Time) (*TLSBundle, *x509.Certificate, *ecdsa.PrivateKey, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("natsauth: tls: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "hedgerow NATS CA", Organization: []string{"hedgerow"}},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("natsauth: tls: CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("natsauth: tls: CA: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(caKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("natsauth: tls: CA: %w", err)
	}
	b := &TLSBundle{Files: map[string][]byte{CAFile: pemBlock("CERTIFICATE", caDER)}, CAKey: pemBlock("EC PRIVATE KEY", keyDER)}
	return b, ca, caKey, nil
}

// parse reads the CA's certificate and its ECDSA key.
func (c *CA) parse() (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, _ := pem.Decode(c.CertPEM)
	kb, _ := pem.Decode(c.KeyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("natsauth: tls: the CA's certificate or key holds no PEM block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("natsauth: tls: CA: %w", err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("natsauth: tls: CA key: %w", err)
	}
	if !cert.IsCA || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, nil, errors.New("natsauth: tls: the CA's key is not its certificate's, or the certificate is no CA")
	}
	return cert, key, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		// crypto/rand does not fail on Linux; a fixed serial would still
		// make a valid certificate.
		return big.NewInt(1)
	}
	return n
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// ServerTLSConfig is the nats-server tls block for the files of dir (their
// absolute paths): the server certificate, the CA, and verify — a client
// without a certificate the CA signed is refused before it authenticates.
func ServerTLSConfig(dir string) (string, error) {
	abs, err := filepath.Abs(filepath.Join(dir, TLSDir))
	if err != nil {
		return "", fmt.Errorf("natsauth: tls: %w", err)
	}
	return tlsBlock(abs, ""), nil
}

// tlsBlock is a tls block for the server certificate, the CA and verify,
// the files in tlsDir (absolute), each line after the first indented.
func tlsBlock(tlsDir, indent string) string {
	return fmt.Sprintf("tls {\n%[1]s  cert_file: %[2]s\n%[1]s  key_file: %[3]s\n%[1]s  ca_file: %[4]s\n%[1]s  verify: true\n%[1]s  timeout: 2\n%[1]s}\n",
		indent, strconv.Quote(filepath.Join(tlsDir, ServerCertFile)), strconv.Quote(filepath.Join(tlsDir, ServerKeyFile)),
		strconv.Quote(filepath.Join(tlsDir, CAFile)))
}

// write puts the files into dir/TLSDir (0700), each 0600, never
// overwriting, and the server's tls block into dir/TLSServerConfigFile;
// the key of a CA made here too when withCAKey.
func (t *TLSBundle) write(dir string, withCAKey bool) error {
	if t == nil {
		return errors.New("natsauth: tls: nothing generated")
	}
	tdir := filepath.Join(dir, TLSDir)
	if err := os.MkdirAll(tdir, 0o700); err != nil {
		return fmt.Errorf("natsauth: %w", err)
	}
	files := map[string][]byte{}
	for name, data := range t.Files {
		files[filepath.Join(TLSDir, name)] = data
	}
	if withCAKey && t.CAKey != nil {
		files[filepath.Join(TLSDir, CAKeyFile)] = t.CAKey
	}
	block, err := ServerTLSConfig(dir)
	if err != nil {
		return err
	}
	files[TLSServerConfigFile] = []byte(block)
	return writeNew(dir, files)
}
