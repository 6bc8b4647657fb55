package configschema

// DecodeHCLDec is the reference the block decoder is tested against.
var DecodeHCLDec = decodeHCLDec
