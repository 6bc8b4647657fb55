package consul

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

// TestTLS talks to the agent's HTTPS port, which requires a client
// certificate, with ca_file, cert_file, key_file and server_name.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	files := writeTestPKI(t, dir)
	c := startConsul(t, testbed.ConsulHTTPS(), testbed.ConsulHCL(fmt.Sprintf(`
tls {
  defaults {
    ca_file   = %q
    cert_file = %q
    key_file  = %q
  }
  https { verify_incoming = true }
}
`, files["ca"], files["server.crt"], files["server.key"])))
	register(t, c.Client(), api.AgentServiceRegistration{ID: "web-1", Name: "web", Port: 8080, Address: "10.0.0.1"}, api.HealthPassing)
	addr := fmt.Sprintf("127.0.0.1:%d", c.HTTPSPort)
	base := fmt.Sprintf("address = %q\nscheme = \"https\"\ndatacenters = [\"dc1\"]\nca_file = %q\nserver_name = \"consul.test\"\n", addr, files["ca"])

	t.Run("client certificate", func(t *testing.T) {
		p := startStrict(t)
		p.configure(t, base+fmt.Sprintf("cert_file = %q\nkey_file = %q\n", files["client.crt"], files["client.key"]))
		p.watch(t)
		p.waitFor(t, wait, "web over HTTPS", func(r *sdktest.Replica) bool {
			return dc1(r) != nil && dc1(r).Synced && len(endpointsOf(r, "web.service.consul")) == 1
		})
	})
	t.Run("no client certificate", func(t *testing.T) {
		p := startStrict(t)
		p.configure(t, base)
		p.watch(t)
		p.waitFor(t, wait, "unhealthy, naming TLS", func(r *sdktest.Replica) bool {
			h, msg, known := healthOf(r)
			return known && !h && strings.Contains(msg, "tls")
		})
	})
	t.Run("wrong server name", func(t *testing.T) {
		p := startStrict(t)
		p.configure(t, strings.Replace(base, "consul.test", "other.test", 1)+fmt.Sprintf("cert_file = %q\nkey_file = %q\n", files["client.crt"], files["client.key"]))
		p.watch(t)
		p.waitFor(t, wait, "unhealthy, naming the certificate", func(r *sdktest.Replica) bool {
			h, msg, known := healthOf(r)
			return known && !h && strings.Contains(msg, "certificate")
		})
	})
}

// writeTestPKI writes a CA, a server certificate for consul.test and
// 127.0.0.1, and a client certificate, as PEM files in dir.
func writeTestPKI(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	write := func(name, typ string, der []byte) {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		files[name] = path
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "estuary test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	files["ca"] = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(files["ca"], pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			DNSNames: []string{"consul.test", "localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		write(name+".crt", "CERTIFICATE", der)
		write(name+".key", "EC PRIVATE KEY", keyDER)
	}
	leaf("server", 2, x509.ExtKeyUsageServerAuth)
	leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return files
}
