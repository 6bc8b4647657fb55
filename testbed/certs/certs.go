// Package certs makes certificate authorities and the certificates they
// issue, with crypto/x509, for tests of TLS with SPIFFE identities: a
// server certificate for 127.0.0.1, and client certificates whose URI SAN
// is a SPIFFE ID, as Istio's CA issues them.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate, for trust bundles.
	PEM []byte
}

// Pair is an issued certificate and its key, in PEM.
type Pair struct {
	CertPEM, KeyPEM []byte
}

func serial(tb testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// NewCA makes a CA named name.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(tb), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return &CA{Cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *CA) issue(tb testing.TB, tmpl *x509.Certificate) Pair {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl.SerialNumber = serial(tb)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
	if err != nil {
		tb.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
	}
}

// Server issues a serving certificate for 127.0.0.1, ::1 and localhost.
func (ca *CA) Server(tb testing.TB, cn string) Pair {
	return ca.issue(tb, &x509.Certificate{
		Subject: pkix.Name{CommonName: cn}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, DNSNames: []string{"localhost"},
	})
}

// Client issues a client certificate whose URI SANs are uris (a SPIFFE
// ID, or none, or several).
func (ca *CA) Client(tb testing.TB, uris ...string) Pair {
	tb.Helper()
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: "workload"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			tb.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	return ca.issue(tb, tmpl)
}

// TLS is the pair as a tls.Certificate.
func (p Pair) TLS(tb testing.TB) tls.Certificate {
	tb.Helper()
	c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// Write writes the pair to dir/name.crt and dir/name.key and returns the
// two paths.
func (p Pair) Write(tb testing.TB, dir, name string) (certFile, keyFile string) {
	tb.Helper()
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	WriteFile(tb, certFile, p.CertPEM)
	WriteFile(tb, keyFile, p.KeyPEM)
	return certFile, keyFile
}

// WriteFile writes b to path, mode 0600, failing the test on error.
func WriteFile(tb testing.TB, path string, b []byte) {
	tb.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		tb.Fatal(err)
	}
}

// Pool is a cert pool of the given CAs.
func Pool(cas ...*CA) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca.Cert)
	}
	return p
}

// Workload issues a workload certificate as Istio's CA does: the SPIFFE
// ID as its URI SAN, good for serving and for client authentication,
// and valid for 127.0.0.1, where test workloads listen.
func (ca *CA) Workload(tb testing.TB, spiffeID string) Pair {
	tb.Helper()
	u, err := url.Parse(spiffeID)
	if err != nil {
		tb.Fatal(err)
	}
	return ca.issue(tb, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "workload"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, URIs: []*url.URL{u},
	})
}
