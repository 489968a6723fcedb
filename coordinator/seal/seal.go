// Package seal encrypts secrets (BMC passwords) with AES-256-GCM under a
// keyring file before they are proposed to Raft. The key id is recorded with
// every sealed value so keys can be rotated: the keyring's primary key seals,
// any key in it opens.
//
// The associated data binds a sealed value to its owner (the node name), so
// a ciphertext copied onto another node does not open.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"

	"github.com/obmesh/obmesh/coordinator/state"
)

// ErrOpen means a sealed value could not be opened: unknown key id, wrong
// owner or tampered ciphertext. The error never contains key material.
var ErrOpen = errors.New("seal: cannot open sealed value")

// Keyring holds the keys. It is safe for concurrent use (read-only).
type Keyring struct {
	primary string
	aeads   map[string]cipher.AEAD
}

// file is the keyring file format.
type file struct {
	Primary string            `json:"primary"`
	Keys    map[string]string `json:"keys"` // id -> base64 of 32 bytes
}

var keyIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Load reads a keyring file. The file must not be readable by group or
// others.
func Load(path string) (*Keyring, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("seal: keyring: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("seal: keyring %s has mode %v; it must not be readable by group or others (chmod 600)", path, fi.Mode().Perm())
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("seal: keyring: %w", err)
	}
	var f file
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("seal: keyring %s: not a keyring file: %v", path, err)
	}
	k := &Keyring{primary: f.Primary, aeads: map[string]cipher.AEAD{}}
	for id, b64 := range f.Keys {
		if !keyIDRe.MatchString(id) {
			return nil, fmt.Errorf("seal: keyring %s: bad key id %q", path, id)
		}
		key, err := base64.StdEncoding.DecodeString(b64)
		if err != nil || len(key) != 32 {
			return nil, fmt.Errorf("seal: keyring %s: key %q must be 32 bytes in base64", path, id)
		}
		aead, err := newAEAD(key)
		if err != nil {
			return nil, err
		}
		k.aeads[id] = aead
	}
	if _, ok := k.aeads[f.Primary]; !ok {
		return nil, fmt.Errorf("seal: keyring %s: primary key %q is not in the keyring", path, f.Primary)
	}
	return k, nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	return cipher.NewGCM(block)
}

// Create writes a new keyring file with one fresh random key, mode 0600. It
// refuses to overwrite an existing file.
func Create(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("seal: create keyring: %w", err)
	}
	defer f.Close()
	key := make([]byte, 32)
	rand.Read(key)
	idb := make([]byte, 4)
	rand.Read(idb)
	id := fmt.Sprintf("k%x", idb)
	b, _ := json.MarshalIndent(file{Primary: id, Keys: map[string]string{id: base64.StdEncoding.EncodeToString(key)}}, "", "  ")
	if _, err := f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("seal: create keyring: %w", err)
	}
	return f.Close()
}

// PrimaryID is the id of the key new values are sealed with.
func (k *Keyring) PrimaryID() string { return k.primary }

// Seal encrypts plaintext for owner with the primary key.
func (k *Keyring) Seal(plaintext []byte, owner string) state.Sealed {
	aead := k.aeads[k.primary]
	nonce := make([]byte, aead.NonceSize())
	rand.Read(nonce)
	return state.Sealed{KeyID: k.primary, Nonce: nonce, Ciphertext: aead.Seal(nil, nonce, plaintext, aad(k.primary, owner))}
}

// Open decrypts a sealed value for owner.
func (k *Keyring) Open(s state.Sealed, owner string) ([]byte, error) {
	aead, ok := k.aeads[s.KeyID]
	if !ok {
		return nil, fmt.Errorf("%w: key %q is not in this coordinator's keyring", ErrOpen, s.KeyID)
	}
	if len(s.Nonce) != aead.NonceSize() {
		return nil, ErrOpen
	}
	p, err := aead.Open(nil, s.Nonce, s.Ciphertext, aad(s.KeyID, owner))
	if err != nil {
		return nil, ErrOpen
	}
	return p, nil
}

func aad(keyID, owner string) []byte { return []byte("obmesh-seal-v1\x00" + keyID + "\x00" + owner) }
