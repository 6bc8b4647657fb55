package sdk

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
	// map(string), map(number), list(number), ...
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
