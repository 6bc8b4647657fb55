package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// adminClient reads debug pages of a running host's admin server,
// presenting the admin token or a client certificate when the admin block
// asks for them.
type adminClient struct {
	addr                                 string
	tokenFile, caFile, certFile, keyFile string
}

// adminFlags registers the flags that say how to reach the admin server.
func adminFlags(fs *flag.FlagSet) *adminClient {
	c := &adminClient{}
	fs.StringVar(&c.addr, "admin", "127.0.0.1:15014", "admin address of the running estuary")
	fs.StringVar(&c.tokenFile, "admin-token-file", "", "file holding the admin token (admin { token_file })")
	fs.StringVar(&c.caFile, "admin-ca-file", "", "CA of the admin server's certificate (admin { tls }); implies https")
	fs.StringVar(&c.certFile, "admin-cert-file", "", "client certificate for an admin server with tls { client_ca_file }; implies https")
	fs.StringVar(&c.keyFile, "admin-key-file", "", "key of --admin-cert-file")
	return c
}

// get reads path?q.
func (c *adminClient) get(path string, q url.Values) ([]byte, error) {
	client, scheme, err := c.httpClient()
	if err != nil {
		return nil, fmt.Errorf("estuary at %s: %w", c.addr, err)
	}
	req, err := http.NewRequest(http.MethodGet, scheme+"://"+c.addr+path+"?"+q.Encode(), nil)
	if err != nil {
		return nil, fmt.Errorf("estuary at %s: %w", c.addr, err)
	}
	if c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("admin token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(b)))
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("estuary at %s: %w", c.addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("estuary at %s: %w", c.addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("estuary at %s: %s: %s", c.addr, resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// httpClient is plain HTTP unless a CA or a client certificate is given.
func (c *adminClient) httpClient() (*http.Client, string, error) {
	client := &http.Client{Timeout: 30 * time.Second}
	if c.caFile == "" && c.certFile == "" {
		return client, "http", nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.caFile != "" {
		b, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, "", err
		}
		conf.RootCAs = x509.NewCertPool()
		if !conf.RootCAs.AppendCertsFromPEM(b) {
			return nil, "", fmt.Errorf("%s holds no PEM certificate", c.caFile)
		}
	}
	if c.certFile != "" {
		cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
		if err != nil {
			return nil, "", err
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	client.Transport = &http.Transport{TLSClientConfig: conf}
	return client, "https", nil
}

// show prints a JSON debug page: as it is with raw (--json), else decoded
// into a T and printed by print. It returns the command's exit status.
func show[T any](c *adminClient, path string, q url.Values, raw bool, print func(io.Writer, *T)) int {
	body, err := c.get(path, q)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if raw {
		os.Stdout.Write(body)
		return 0
	}
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
		return 1
	}
	print(os.Stdout, &v)
	return 0
}
