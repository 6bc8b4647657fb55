package sdk

import (
	"encoding/json"
	"fmt"
	"time"
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
