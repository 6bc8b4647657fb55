package config_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/estuary-mesh/estuary/host/config"
)

// TestXDSSecurityErrors: each bad xds security setting is reported at the
// attribute or block that holds it.
func TestXDSSecurityErrors(t *testing.T) {
	tests := []struct {
		name, src, want string
	}{{
		name: "plain text beyond loopback",
		src: `xds {
  listen = "0.0.0.0:15010"
}
`,
		want: `plugins.hcl:2:12: error: xDS beyond loopback needs tls: listen "0.0.0.0:15010" is reachable from other hosts`,
	}, {
		name: "all interfaces by an empty host",
		src: `xds {
  listen = ":15010"
}
`,
		want: `plugins.hcl:2:12: error: xDS beyond loopback needs tls`,
	}, {
		name: "tls without key_file",
		src: `xds {
  tls {
    cert_file = "a.crt"
  }
}
`,
		want: `plugins.hcl:2:7: error: Missing required argument: The argument "key_file" is required`,
	}, {
		name: "authorize without client certificates",
		src: `xds {
  tls {
    cert_file = "a.crt"
    key_file  = "a.key"
  }
  authorize {
    routers = []
  }
}
`,
		want: `plugins.hcl:6:3: error: authorize needs client certificates`,
	}, {
		name: "router is not a SPIFFE ID",
		src: `xds {
  tls {
    cert_file      = "a.crt"
    key_file       = "a.key"
    client_ca_file = "ca.crt"
  }
  authorize {
    routers = ["istio-system/eastwestgateway"]
  }
}
`,
		want: `plugins.hcl:8:15: error: Invalid router identity: routers[0]: "istio-system/eastwestgateway" is not a SPIFFE ID`,
	}, {
		name: "duplicate trust domain",
		src: `xds {
  tls {
    cert_file      = "a.crt"
    key_file       = "a.key"
    client_ca_file = "ca.crt"
  }
  authorize {
    trust_domain "cluster.local" {}
    trust_domain "cluster.local" {}
  }
}
`,
		want: `plugins.hcl:9:5: error: Duplicate trust_domain block`,
	}, {
		name: "limit not positive",
		src: `xds {
  max_views = 0
}
`,
		want: `plugins.hcl:2:15: error: Invalid max_views: max_views must be a positive number, not 0`,
	}, {
		name: "negative unknown types",
		src: `xds {
  max_unknown_types = -1
}
`,
		want: `plugins.hcl:2:23: error: Invalid max_unknown_types`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, got := parse(t, tt.src)
			if !strings.HasPrefix(got, tt.want) {
				t.Errorf("got\n%s\nwant a line starting\n%s", got, tt.want)
			}
		})
	}
}

// TestXDSSecuritySettings: what is accepted, and how it decodes.
func TestXDSSecuritySettings(t *testing.T) {
	f, diags := parse(t, `xds {
  listen   = "0.0.0.0:0"
  insecure = true
}
`)
	if diags != "" || !f.XDS.Insecure || !f.XDS.Exposed() {
		t.Fatalf("insecure beyond loopback: %s %+v", diags, f.XDS)
	}
	if d := f.XDS; d.MaxViews != config.DefaultMaxViews || d.MaxConnections != config.DefaultMaxConnections ||
		d.MaxStreamsPerConnection != config.DefaultMaxStreamsPerConnection || d.MaxResourceNames != config.DefaultMaxResourceNames ||
		d.MaxUnknownTypes != config.DefaultMaxUnknownTypes {
		t.Errorf("limits are not the defaults: %+v", d)
	}
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0", "localhost:0"} {
		f, diags := parse(t, "xds {\n  listen = \""+addr+"\"\n}\n")
		if diags != "" || f.XDS.Exposed() {
			t.Errorf("%s: %s, exposed %v", addr, diags, f.XDS.Exposed())
		}
	}
	f, diags = parse(t, `xds {
  listen                     = "10.0.0.1:15012"
  max_views                  = 10
  max_connections            = 20
  max_streams_per_connection = 3
  max_resource_names         = 40
  max_unknown_types          = 0
  tls {
    cert_file      = "a.crt"
    key_file       = "a.key"
    client_ca_file = "ca.crt"
  }
  authorize {
    routers = ["spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway"]
    trust_domain "cluster.local" {
      clusters = ["cluster1"]
      networks = ["network1", "network2"]
    }
  }
}
`)
	if diags != "" {
		t.Fatal(diags)
	}
	x := f.XDS
	if x.Exposed() || x.TLS.CertFile != "a.crt" || x.TLS.KeyFile != "a.key" || x.TLS.ClientCAFile != "ca.crt" ||
		x.MaxViews != 10 || x.MaxConnections != 20 || x.MaxStreamsPerConnection != 3 || x.MaxResourceNames != 40 || x.MaxUnknownTypes != 0 {
		t.Errorf("decoded %+v, tls %+v", x, x.TLS)
	}
	if !slices.Equal(x.Authorize.Routers, []string{"spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway"}) ||
		!slices.Equal(x.Authorize.TrustDomains["cluster.local"].Networks, []string{"network1", "network2"}) ||
		!slices.Equal(x.Authorize.TrustDomains["cluster.local"].Clusters, []string{"cluster1"}) {
		t.Errorf("authorize decoded as %+v", x.Authorize)
	}
}

// TestCheckXDSTLSFiles: missing and unparsable files are reported at the
// attribute naming them; good ones pass.
func TestCheckXDSTLSFiles(t *testing.T) {
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "xds"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}, &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "xds"}}, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	crt := write("xds.crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	k := write("xds.key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
	junk := write("junk.pem", []byte("not pem"))
	src := func(cert, key, ca string) string {
		return "xds {\n  tls {\n    cert_file = \"" + cert + "\"\n    key_file = \"" + key + "\"\n    client_ca_file = \"" + ca + "\"\n  }\n}\n"
	}
	check := func(s string) string {
		f, diags := parse(t, s)
		if diags != "" {
			t.Fatal(diags)
		}
		return config.Format(config.CheckXDSTLSFiles(&f.XDS))
	}
	if got := check(src(crt, k, crt)); got != "" {
		t.Errorf("good files: %s", got)
	}
	if got := check(src(crt, k, filepath.Join(dir, "missing.crt"))); !strings.HasPrefix(got, "plugins.hcl:5:22: error: Cannot read xds tls file") {
		t.Errorf("missing CA: %s", got)
	}
	if got := check(src(crt, junk, junk)); !strings.Contains(got, "plugins.hcl:3:17: error: Invalid xds tls certificate or key") ||
		!strings.Contains(got, "plugins.hcl:5:22: error: Invalid xds client_ca_file") {
		t.Errorf("junk key and CA: %s", got)
	}
}
