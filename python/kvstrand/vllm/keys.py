"""Chunk keys of a vLLM request: what identifies a stored chunk's content.

A chunk's KV is a function of every token before its end, and of what vLLM
feeds the model besides the token ids: the multimodal items placed in that
prefix (their placeholder tokens are equal across images; their hashes are
not), the LoRA adapter, and the request's cache salt. vLLM's own prefix
cache folds the same three into its block hashes ("extra keys"). kvstrand
does not take vLLM's block hashes as keys: they start from a per-process
random seed unless PYTHONHASHSEED is set, so two engines on a node (or one
engine after a restart) would never share a chunk. Instead the extra keys
are folded into kvstrand's own key chain:

    key_i = kvstrand.chunk_hashes(ns, tokens)[i]              no extra keys
    key_i = blake2b(token_hash_i | request_seed | mm_chain_i)  otherwise

where request_seed hashes the LoRA name, the cache salt and the key epoch
(reset_cache), and mm_chain_i chains every multimodal item whose placeholder
starts before the chunk's end. A request without extra keys keeps the plain
token chain, so it shares chunks with C++ engines and earlier kvstrand.vllm
versions. A request whose content cannot be keyed (prompt embeddings instead
of token ids) gets no keys: it is neither looked up nor stored.
"""

import hashlib

import kvstrand

_DOMAIN = b"kvstrand.vllm.extra-keys/1"


def _lp(data):
    """Length-prefixed, so that no two field sequences hash alike."""
    return len(data).to_bytes(8, "little") + data


def _text(value):
    return b"" if value is None else str(value).encode()


def multimodal_items(request):
    """(offset, length, identifier) of each multimodal item, by offset.
    vLLM >= 0.11 carries them as request.mm_features (identifier, mm_position);
    earlier versions as request.mm_hashes beside request.mm_positions."""
    features = getattr(request, "mm_features", None)
    if features:
        items = [(int(f.mm_position.offset), int(f.mm_position.length), _text(f.identifier)) for f in features]
    else:
        hashes = getattr(request, "mm_hashes", None) or []
        positions = getattr(request, "mm_positions", None) or []
        items = [(int(p.offset), int(p.length), _text(h)) for h, p in zip(hashes, positions)]
    return sorted(items)


def request_seed(request, epoch=0):
    """What besides tokens and multimodal items changes every chunk's KV, or
    None when nothing does."""
    lora = getattr(request, "lora_request", None)
    lora_name = getattr(lora, "lora_name", None) if lora is not None else None
    salt = getattr(request, "cache_salt", None)
    if lora_name is None and salt is None and epoch == 0:
        return None
    return hashlib.blake2b(_DOMAIN + _lp(_text(lora_name)) + _lp(_text(salt)) + epoch.to_bytes(8, "little"),
                           digest_size=32).digest()


def keyable(request):
    """False for requests whose prompt is not token ids (prompt embeddings)."""
    if getattr(request, "prompt_embeds", None) is not None:
        return False
    return getattr(request, "prompt_token_ids", None) is not None


def chunk_hashes(ns, request, chunk_tokens, epoch=0):
    """One hash per full chunk of the request's prompt (see the module's
    docstring), or None when the request cannot be keyed."""
    if not keyable(request):
        return None
    tokens = list(request.prompt_token_ids)
    base = kvstrand.chunk_hashes(ns, tokens, chunk_tokens)
    seed = request_seed(request, epoch)
    items = multimodal_items(request)
    if seed is None and not items:
        return base
    out, chain, pending = [], hashlib.blake2b(_DOMAIN, digest_size=32), list(items)
    seed = seed or b""
    for i, token_hash in enumerate(base):
        end = (i + 1) * chunk_tokens
        while pending and pending[0][0] < end:  # this item's KV is inside the prefix now
            offset, length, ident = pending.pop(0)
            chain.update(_lp(offset.to_bytes(8, "little") + length.to_bytes(8, "little") + ident))
        out.append(hashlib.blake2b(token_hash + _lp(seed) + chain.copy().digest(), digest_size=32).digest())
    return out
