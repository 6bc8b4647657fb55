package xds

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/credentials"
)

// TLSFiles are the server's certificate and key and, optionally, the CA
// bundle client certificates must chain to. With a client CA, every client
// must present a certificate, and its SPIFFE ID is its identity.
type TLSFiles struct {
	CertFile, KeyFile, ClientCAFile string
	// Poll is how often the files are checked for changes; 0 is 1s.
	Poll time.Duration
}

// tlsMaterial is one loaded generation of the files: the server config
// every handshake from then on uses.
type tlsMaterial struct {
	config *tls.Config
	digest [sha256.Size]byte
}

// tlsReloader serves handshakes from the files as they are now: it polls
// their size and mtime, and when either moved, rereads them and swaps in
// the new certificate if their contents changed and parse. Connections
// already made keep the certificate they were made with, so no stream is
// dropped; a pair that does not parse (a key written before its
// certificate) is logged and the previous one kept until the next change.
type tlsReloader struct {
	files  TLSFiles
	logger hclog.Logger
	cur    atomic.Pointer[tlsMaterial]
	stamp  string // sizes and mtimes last seen
	failed [sha256.Size]byte
	// reloaded observes every swap and failed reload, for metrics.
	reloaded func(ok bool)
}

func newTLSReloader(files TLSFiles, logger hclog.Logger) (*tlsReloader, error) {
	if files.Poll == 0 {
		files.Poll = time.Second
	}
	r := &tlsReloader{files: files, logger: logger}
	r.stamp = r.statFiles()
	m, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cur.Store(m)
	return r, nil
}

func (r *tlsReloader) paths() []string {
	p := []string{r.files.CertFile, r.files.KeyFile}
	if r.files.ClientCAFile != "" {
		p = append(p, r.files.ClientCAFile)
	}
	return p
}

// statFiles fingerprints the files cheaply; it follows symlinks, so a
// Kubernetes Secret volume's atomic ..data swap is seen.
func (r *tlsReloader) statFiles() string {
	var b bytes.Buffer
	for _, p := range r.paths() {
		if fi, err := os.Stat(p); err == nil {
			fmt.Fprintf(&b, "%d/%d;", fi.Size(), fi.ModTime().UnixNano())
		} else {
			b.WriteString("missing;")
		}
	}
	return b.String()
}

// load reads and parses the files.
func (r *tlsReloader) load() (*tlsMaterial, error) {
	h := sha256.New()
	var raw [3][]byte
	for i, p := range r.paths() {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("xds tls: %w", err)
		}
		raw[i] = b
		h.Write(b)
	}
	m := &tlsMaterial{}
	h.Sum(m.digest[:0])
	cert, err := tls.X509KeyPair(raw[0], raw[1])
	if err != nil {
		return m, fmt.Errorf("xds tls: cert_file %s and key_file %s: %w", r.files.CertFile, r.files.KeyFile, err)
	}
	m.config = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		// gRPC needs HTTP/2 by ALPN; grpc-go clients refuse a server that
		// does not negotiate it.
		NextProtos: []string{"h2"},
	}
	if r.files.ClientCAFile != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(raw[2]) {
			return m, fmt.Errorf("xds tls: client_ca_file %s holds no PEM certificate", r.files.ClientCAFile)
		}
		m.config.ClientCAs = pool
		m.config.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return m, nil
}

// check reloads the files if they changed.
func (r *tlsReloader) check() {
	stamp := r.statFiles()
	if stamp == r.stamp {
		return
	}
	r.stamp = stamp
	m, err := r.load()
	switch {
	case m == nil: // a file is unreadable: perhaps mid-rotation
		r.logger.Warn("cannot read the xDS TLS files; keeping the loaded ones", "error", err)
	case m.digest == r.cur.Load().digest:
	case err != nil:
		if m.digest != r.failed {
			r.failed = m.digest
			r.logger.Error("xDS TLS files changed but do not load; keeping the previous ones", "error", err)
			if r.reloaded != nil {
				r.reloaded(false)
			}
		}
	default:
		r.cur.Store(m)
		r.logger.Info("reloaded the xDS TLS files", "cert_file", r.files.CertFile)
		if r.reloaded != nil {
			r.reloaded(true)
		}
	}
}

// run polls the files until ctx ends.
func (r *tlsReloader) run(ctx context.Context) {
	t := time.NewTicker(r.files.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.check()
		}
	}
}

// credentials are gRPC server credentials whose every handshake reads the
// current files. TLS 1.2 is the least accepted. A failed handshake (no
// client certificate, one from another CA) is reported to failed.
func (r *tlsReloader) credentials(failed func(net.Addr, error)) credentials.TransportCredentials {
	base := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return r.cur.Load().config, nil
		},
	}
	return &observedCreds{TransportCredentials: credentials.NewTLS(base), failed: failed}
}

// observedCreds reports failed server handshakes, which gRPC otherwise
// only closes.
type observedCreds struct {
	credentials.TransportCredentials
	failed func(net.Addr, error)
}

func (c *observedCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil && c.failed != nil {
		c.failed(conn.RemoteAddr(), err)
	}
	return out, info, err
}

func (c *observedCreds) Clone() credentials.TransportCredentials {
	return &observedCreds{TransportCredentials: c.TransportCredentials.Clone(), failed: c.failed}
}
