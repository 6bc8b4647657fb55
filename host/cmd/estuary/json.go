package main

import "encoding/json"

// rawJSON embeds already-encoded JSON (null when empty).
func rawJSON(b []byte) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return json.RawMessage(b)
}
