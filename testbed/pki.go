package testbed

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the files a test cluster needs, all made with crypto/x509.
type pki struct {
	caPEM                 []byte
	caCert, caKey         string // files
	serverCert, serverKey string
	clientCert, clientKey string // CN=admin, O=system:masters
	clientCertPEM         []byte
	clientKeyPEM          []byte
	saKey, saPub          string // service-account signing key pair
	tokenFile, adminToken string
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func newKey() (*ecdsa.PrivateKey, []byte, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, nil, err
	}
	return k, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err)
	}
	return n
}

func signCert(tmpl, parent *x509.Certificate, pub crypto.PublicKey, signer crypto.Signer) (*x509.Certificate, []byte, error) {
	if parent == nil { // self-signed
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// writePKI creates a CA, a serving cert for 127.0.0.1/localhost/kubernetes.*,
// an admin client cert, a service-account key pair and a token file with one
// random system:masters token, all under dir.
func writePKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	now := time.Now().Add(-time.Hour) // tolerate small clock differences
	notAfter := now.Add(10 * 365 * 24 * time.Hour)

	caKey, caKeyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	caCert, caPEM, err := signCert(&x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "estuary-testbed-ca"},
		NotBefore:             now,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}, nil, caKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("testbed: CA: %w", err)
	}
	srvKey, srvKeyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	_, srvPEM, err := signCert(&x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default",
			"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	}, caCert, srvKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("testbed: server cert: %w", err)
	}

	cliKey, cliKeyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	_, cliPEM, err := signCert(&x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		NotBefore:    now,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, caCert, cliKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("testbed: client cert: %w", err)
	}

	saKey, saKeyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, err
	}

	p := &pki{
		caPEM:         caPEM,
		caCert:        filepath.Join(dir, "ca.crt"),
		caKey:         filepath.Join(dir, "ca.key"),
		serverCert:    filepath.Join(dir, "apiserver.crt"),
		serverKey:     filepath.Join(dir, "apiserver.key"),
		clientCert:    filepath.Join(dir, "admin.crt"),
		clientKey:     filepath.Join(dir, "admin.key"),
		clientCertPEM: cliPEM,
		clientKeyPEM:  cliKeyPEM,
		saKey:         filepath.Join(dir, "sa.key"),
		saPub:         filepath.Join(dir, "sa.pub"),
		tokenFile:     filepath.Join(dir, "tokens.csv"),
		adminToken:    "admin-" + randomHex(16),
	}
	files := []struct {
		path string
		data []byte
	}{
		{p.caCert, caPEM},
		{p.caKey, caKeyPEM},
		{p.serverCert, srvPEM},
		{p.serverKey, srvKeyPEM},
		{p.clientCert, cliPEM},
		{p.clientKey, cliKeyPEM},
		{p.saKey, saKeyPEM},
		{p.saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER})},
		// token,user,uid,"group1,group2"
		{p.tokenFile, []byte(p.adminToken + ",admin,admin,system:masters\n")},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}
