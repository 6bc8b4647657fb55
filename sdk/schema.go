package sdk

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/estuary-mesh/estuary/sdk/redact"
)

// Schema is the shape of an HCL body. The host decodes a plugin's
// `config { }` block against it and reports errors with their position.
type Schema struct {
	Attributes []Attribute
	Blocks     []Block
}

// Attribute is one `name = value` entry.
type Attribute struct {
	Name string
	// Type is an HCL type expression: string, number, bool, list(string),
	// map(string), map(number), list(number), ... or TypeDuration.
	Type        string
	Required    bool
	Description string
	// Sensitive marks a credential: a token, a password, or the path of a
	// file that holds one. The host hands its value to the plugin and
	// nowhere else: /debug/configz shows "(sensitive)", and logs, health
	// messages and `estuary validate` never quote it.
	Sensitive bool
}

// Block is a nested block type.
type Block struct {
	TypeName string
	// Labels names the block's labels, e.g. []string{"hostname"}.
	Labels []string
	// Single blocks appear at most once; others any number of times.
	Single      bool
	Body        Schema
	Description string
}

// TypeDuration is the Attribute.Type of a duration, written as Go's
// time.ParseDuration reads it: "30s", "5m", "1h30m". The host decodes it
// as a string and rejects anything else at the attribute's position
// (plugins.hcl:LINE:COL), before the plugin sees it; the plugin decodes
// the attribute into a [Duration] and checks only its range.
const TypeDuration = "duration"

// Duration is the decoded value of a TypeDuration attribute. Use a
// *Duration field, so an unset attribute (null) stays nil:
//
//	WaitTime *sdk.Duration `json:"wait_time"`
type Duration struct{ time.Duration }

// ParseDuration parses a TypeDuration value; the error names the value
// and shows the expected form.
func ParseDuration(s string) (Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return Duration{}, fmt.Errorf("%q is not a duration such as \"30s\", \"5m\" or \"1h30m\"", s)
	}
	return Duration{d}, nil
}

// UnmarshalJSON reads the duration string the host sends.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string such as \"30s\": %w", err)
	}
	v, err := ParseDuration(s)
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// MarshalJSON writes the duration as a string ParseDuration reads back.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// SensitivePlaceholder stands for a sensitive attribute's value in views
// of a config block, such as the host's /debug/configz.
const SensitivePlaceholder = "(sensitive)"

// SensitiveValues returns every string held by a sensitive attribute of
// configJSON, a block decoded against s (as ConfigureRequest.ConfigJSON),
// including those of nested blocks and inside lists and maps. The host and
// the SDK register them with a [redact.Secrets] set, so that they never
// reach a log or a health message.
func (s *Schema) SensitiveValues(configJSON []byte) []string {
	if !s.hasSensitive() {
		// Nothing to find: skip decoding a block that may be megabytes
		// (a static plugin's 10,000 endpoints) on every load and reload.
		return nil
	}
	var out []string
	s.walk(configJSON, func(v any) any {
		collectStrings(v, &out)
		return v
	})
	return out
}

// hasSensitive reports whether s or any nested block declares a sensitive
// attribute.
func (s *Schema) hasSensitive() bool {
	if s == nil {
		return false
	}
	for _, a := range s.Attributes {
		if a.Sensitive {
			return true
		}
	}
	for i := range s.Blocks {
		if s.Blocks[i].Body.hasSensitive() {
			return true
		}
	}
	return false
}

// Redact returns configJSON, a block decoded against s, with the value of
// every sensitive attribute that is set replaced by [SensitivePlaceholder]
// and the credentials of every URL among the other values removed. It is
// what a view of the block shows.
func (s *Schema) Redact(configJSON []byte) []byte {
	out := s.walk(configJSON, func(any) any { return SensitivePlaceholder })
	if out == nil {
		return configJSON
	}
	return out
}

// walk decodes configJSON and calls sensitive on the value of every set
// sensitive attribute, replacing it by the result; other strings lose
// their URL credentials. It returns the block encoded again, or nil if
// configJSON is not a JSON object.
func (s *Schema) walk(configJSON []byte, sensitive func(any) any) []byte {
	if len(configJSON) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(configJSON))
	dec.UseNumber() // numbers come back as written
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil
	}
	s.walkObject(obj, sensitive)
	b, err := json.Marshal(obj)
	if err != nil {
		return nil
	}
	return b
}

func (s *Schema) walkObject(obj map[string]any, sensitive func(any) any) {
	attrs := map[string]*Attribute{}
	blocks := map[string]*Schema{}
	if s != nil {
		for i := range s.Attributes {
			attrs[s.Attributes[i].Name] = &s.Attributes[i]
		}
		for i := range s.Blocks {
			blocks[s.Blocks[i].TypeName] = &s.Blocks[i].Body
		}
	}
	for k, v := range obj {
		switch {
		case v == nil:
		case attrs[k] != nil && attrs[k].Sensitive:
			obj[k] = sensitive(v)
		case blocks[k] != nil:
			if list, ok := v.([]any); ok {
				for _, item := range list {
					if o, ok := item.(map[string]any); ok {
						blocks[k].walkObject(o, sensitive)
					}
				}
			}
		default:
			obj[k] = redactURLs(v)
		}
	}
}

// redactURLs removes URL credentials from every string in v.
func redactURLs(v any) any {
	switch x := v.(type) {
	case string:
		return redact.Text(x)
	case []any:
		for i := range x {
			x[i] = redactURLs(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = redactURLs(x[k])
		}
	}
	return v
}

func collectStrings(v any, out *[]string) {
	switch x := v.(type) {
	case string:
		*out = append(*out, x)
	case []any:
		for _, e := range x {
			collectStrings(e, out)
		}
	case map[string]any:
		for _, e := range x {
			collectStrings(e, out)
		}
	}
}
