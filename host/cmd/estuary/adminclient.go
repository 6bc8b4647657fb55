package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// adminGet reads a debug page of the running host's admin server.
func adminGet(admin, path string, q url.Values) ([]byte, error) {
	resp, err := http.Get("http://" + admin + path + "?" + q.Encode())
	if err != nil {
		return nil, fmt.Errorf("estuary at %s: %w", admin, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("estuary at %s: %w", admin, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("estuary at %s: %s", admin, body)
	}
	return body, nil
}
