"""wit-bindgen c 0.63.0 emits `operator_result_void_string_t` and its free function twice for
wit/operator.wit (two functions return result<_, string> in different scopes); this keeps the
first of each. Run after regenerating gen/:
    wit-bindgen c wit --world operator --out-dir guest-sdk/c/gen && python3 guest-sdk/c/fix-gen.py
"""
import pathlib

gen = pathlib.Path(__file__).parent / "gen"
BLOCK = """typedef struct {
  bool is_err;
  union {
    operator_string_t err;
  } val;
} operator_result_void_string_t;
"""
DECL = "void operator_result_void_string_free(operator_result_void_string_t *ptr);\n"
FREE = "void operator_result_void_string_free(operator_result_void_string_t *ptr) {"


def drop_second(text, piece, end=None):
    first = text.index(piece)
    second = text.find(piece, first + len(piece))
    if second < 0:
        return text
    stop = text.index(end, second) + len(end) if end else second + len(piece)
    return text[:second] + text[stop:]


h = (gen / "operator.h").read_text()
(gen / "operator.h").write_text(drop_second(drop_second(h, BLOCK), DECL))
c = (gen / "operator.c").read_text()
(gen / "operator.c").write_text(drop_second(c, FREE, "\n}\n"))
