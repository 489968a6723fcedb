package hilproxy

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
)

// Token is an obmd token: 128 random bits, written as 32 hex digits (any
// case on input, lowercase on output).
type Token [16]byte

// ErrInvalidToken means a token is malformed or not the node's token.
var ErrInvalidToken = errors.New("invalid token")

// ParseToken parses 32 hex digits.
func ParseToken(s string) (Token, error) {
	var t Token
	if len(s) != 32 {
		return t, ErrInvalidToken
	}
	if _, err := hex.Decode(t[:], []byte(s)); err != nil {
		return Token{}, ErrInvalidToken
	}
	return t, nil
}

// NewToken draws a random token.
func NewToken() Token {
	var t Token
	rand.Read(t[:])
	return t
}

// String returns the token in lowercase hex.
func (t Token) String() string { return hex.EncodeToString(t[:]) }

// MarshalText implements encoding.TextMarshaler (obmd's {"token": "..."}).
func (t Token) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// Equal compares in constant time.
func (t Token) Equal(u Token) bool { return subtle.ConstantTimeCompare(t[:], u[:]) == 1 }
