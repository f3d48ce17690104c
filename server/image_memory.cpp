#include "server/image_memory.hpp"

#include <elf.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>
#include <string_view>

namespace vcuda::server {

namespace {

constexpr uint32_t fatbin_magic = 0xBA55ED50;
constexpr uint64_t fatbin_compressed = 0x2000 | 0x8000;  // LZ4, Zstd (entry flags)
constexpr uint64_t saturated = UINT64_MAX;

uint64_t add(uint64_t a, uint64_t b) { return a > saturated - b ? saturated : a + b; }
uint64_t mul(uint64_t a, uint64_t b) { return b && a > saturated / b ? saturated : a * b; }

template <class T>
bool read_at(std::span<const std::byte> b, uint64_t off, T& out) {
    if (off > b.size() || b.size() - off < sizeof out) return false;
    std::memcpy(&out, b.data() + off, sizeof out);
    return true;
}

bool is_elf(std::span<const std::byte> b) {
    return b.size() >= 4 && std::memcmp(b.data(), ELFMAG, SELFMAG) == 0;
}

std::optional<uint64_t> elf_bytes(std::span<const std::byte> b) {
    Elf64_Ehdr e;
    if (!read_at(b, 0, e) || e.e_ident[EI_CLASS] != ELFCLASS64 || e.e_shentsize != sizeof(Elf64_Shdr) ||
        e.e_shnum == 0 || e.e_shstrndx >= e.e_shnum)
        return std::nullopt;
    Elf64_Shdr names;
    if (!read_at(b, e.e_shoff + uint64_t{e.e_shstrndx} * sizeof names, names) || names.sh_offset > b.size() ||
        names.sh_size > b.size() - names.sh_offset)
        return std::nullopt;
    std::string_view strings(reinterpret_cast<const char*>(b.data()) + names.sh_offset, names.sh_size);
    uint64_t total = 0;
    for (uint64_t i = 0; i < e.e_shnum; ++i) {
        Elf64_Shdr s;
        if (!read_at(b, e.e_shoff + i * sizeof s, s)) return std::nullopt;
        if (!(s.sh_flags & SHF_ALLOC)) continue;
        std::string_view name = s.sh_name < strings.size() ? strings.substr(s.sh_name) : std::string_view{};
        name = name.substr(0, name.find('\0'));
        if (name.starts_with(".nv.shared") || name.starts_with(".nv.local")) continue;
        total = add(total, s.sh_size);
    }
    return total;
}

// The size of one element of PTX type `t` (".u32", ".f16x2", ".b128", ".pred", ".texref"...), 0 if not a
// type.
uint64_t ptx_type_size(std::string_view t) {
    if (t == ".pred") return 1;
    if (t == ".texref" || t == ".samplerref" || t == ".surfref") return 8;
    static constexpr std::string_view prefixes[] = {".bf", ".b", ".u", ".s", ".f", ".e"};
    for (auto p : prefixes) {
        if (!t.starts_with(p) || t.size() == p.size() ||
            !std::isdigit(static_cast<unsigned char>(t[p.size()])))
            continue;
        uint64_t bits = 0;
        size_t i = p.size();
        for (; i < t.size() && std::isdigit(static_cast<unsigned char>(t[i])); ++i)
            bits = bits * 10 + (t[i] - '0');
        uint64_t lanes = 1;
        if (i < t.size() && t[i] == 'x' && i + 1 < t.size())
            lanes = static_cast<uint64_t>(t[i + 1] - '0');
        else if (i < t.size() && t.substr(i).starts_with("m"))
            bits = 8;  // .e4m3, .e5m2: one byte
        return std::max<uint64_t>(1, mul(bits, lanes) / 8);
    }
    return 0;
}

// The elements of one declarator ("buf[64][4]", "x"): its dimensions' product; an unsized dimension ("[]")
// holds one element per value of the initialiser `init`.
uint64_t ptx_elements(std::string_view declarator, std::string_view init) {
    uint64_t count = 1;
    for (size_t open = declarator.find('['); open != std::string_view::npos;
         open = declarator.find('[', open + 1)) {
        size_t close = declarator.find(']', open);
        if (close == std::string_view::npos) return 0;
        uint64_t n = 0;
        if (close == open + 1) {
            n = static_cast<uint64_t>(std::count(init.begin(), init.end(), ',')) + 1;
        } else {
            for (char c : declarator.substr(open + 1, close - open - 1))
                if (std::isdigit(static_cast<unsigned char>(c)))
                    n = add(mul(n, 10), static_cast<uint64_t>(c - '0'));
        }
        count = mul(count, n);
    }
    return count;
}

// One PTX statement (the text since the last ';' or brace, comments removed): the bytes of the .global or
// .const variables it declares, else 0. Directives without a ';' (.version, .target) may precede it; an
// instruction names the state space inside its own token (ld.global.u32), never as a token of its own.
uint64_t ptx_declaration_bytes(std::string_view st) {
    std::string_view init;
    if (auto eq = st.find('='); eq != std::string_view::npos) {
        init = st.substr(eq + 1);
        st = st.substr(0, eq);
    }
    std::vector<std::string_view> tokens;
    for (size_t pos = 0; pos < st.size();) {
        while (pos < st.size() && std::isspace(static_cast<unsigned char>(st[pos]))) ++pos;
        size_t end = pos;
        while (end < st.size() && !std::isspace(static_cast<unsigned char>(st[end]))) ++end;
        if (end > pos) tokens.push_back(st.substr(pos, end - pos));
        pos = end;
    }
    auto space =
        std::find_if(tokens.begin(), tokens.end(), [](auto t) { return t == ".global" || t == ".const"; });
    if (space == tokens.end() || std::find(tokens.begin(), space, ".extern") != space)
        return 0;  // no variable, or one defined elsewhere (no storage here)
    uint64_t elem = 0, vector = 1;
    auto t = space + 1;
    for (; t != tokens.end() && (*t)[0] == '.'; ++t) {
        if (*t == ".align" && t + 1 != tokens.end())
            ++t;  // and its operand
        else if (*t == ".v2" || *t == ".v4" || *t == ".v8")
            vector = static_cast<uint64_t>((*t)[2] - '0');
        else if (!elem)
            elem = ptx_type_size(*t);
    }
    if (!elem || t == tokens.end()) return 0;
    // The declarators: one, or several separated by commas ("a, b[4]").
    std::string_view names = st.substr(static_cast<size_t>(t->data() - st.data()));
    uint64_t total = 0;
    for (size_t from = 0; from <= names.size();) {
        size_t comma = std::min(names.find(',', from), names.size());
        total = add(total, ptx_elements(names.substr(from, comma - from), init));
        from = comma + 1;
    }
    return mul(mul(elem, vector), total);
}

uint64_t ptx_bytes(std::span<const std::byte> b) {
    std::string_view text(reinterpret_cast<const char*>(b.data()), b.size());
    text = text.substr(0, text.find('\0'));
    uint64_t total = 0;
    std::string statement;
    for (size_t i = 0; i < text.size(); ++i) {
        if (text.compare(i, 2, "//") == 0) {
            i = std::min(text.find('\n', i), text.size());
        } else if (text.compare(i, 2, "/*") == 0) {
            i = std::min(text.find("*/", i + 2), text.size()) + 1;
        } else if (text[i] == ';') {
            total = add(total, ptx_declaration_bytes(statement));
            statement.clear();
        } else if (text[i] == '{' || text[i] == '}') {
            // A block opens or closes: what came before it was a header, not a declaration. An initialiser's
            // braces come after '=' and stay in its statement.
            if (statement.find('=') == std::string::npos)
                statement.clear();
            else
                statement.push_back(text[i]);
        } else {
            statement.push_back(text[i]);
        }
    }
    return total;
}

std::optional<uint64_t> fatbin_bytes(std::span<const std::byte> b) {
    uint32_t magic = 0;
    uint16_t header_size = 0;
    uint64_t files_size = 0;
    if (!read_at(b, 0, magic) || !read_at(b, 6, header_size) || !read_at(b, 8, files_size) ||
        magic != fatbin_magic || header_size > b.size() || files_size > b.size() - header_size)
        return std::nullopt;
    uint64_t largest = 0;
    const uint64_t end = header_size + files_size;
    for (uint64_t off = header_size; off < end;) {
        uint16_t kind = 0;
        uint32_t entry_header = 0;
        uint64_t payload = 0, flags = 0, uncompressed = 0;
        if (!read_at(b, off, kind) || !read_at(b, off + 4, entry_header) || !read_at(b, off + 8, payload) ||
            entry_header < 16 || entry_header > end - off || payload > end - off - entry_header)
            return std::nullopt;
        if (entry_header >= 48) read_at(b, off + 40, flags);
        if (entry_header >= 64) read_at(b, off + 56, uncompressed);
        auto bytes = b.subspan(off + entry_header, payload);
        uint64_t charge = 0;
        if (flags & fatbin_compressed) {
            charge = uncompressed ? uncompressed : payload;
        } else if (kind == 2) {
            auto e = elf_bytes(bytes);
            if (!e) return std::nullopt;
            charge = *e;
        } else if (kind == 1) {
            charge = ptx_bytes(bytes);
        }
        largest = std::max(largest, charge);
        off += entry_header + payload;
    }
    return largest;
}

std::span<const std::byte> bytes_of(const std::vector<uint64_t>& part) {
    return std::as_bytes(std::span(part));
}

}  // namespace

std::optional<uint64_t> image_device_bytes(std::span<const std::byte> image) {
    uint32_t magic = 0;
    if (read_at(image, 0, magic) && magic == fatbin_magic) return fatbin_bytes(image);
    if (is_elf(image)) return elf_bytes(image);
    return ptx_bytes(image);  // the driver takes anything else for PTX text
}

std::optional<uint64_t> load_device_bytes(uint64_t format, const std::vector<std::vector<uint64_t>>& parts) {
    if (parts.empty()) return std::nullopt;
    if (format == 0) return image_device_bytes(bytes_of(parts[0]));
    uint64_t total = 0;
    for (const auto& p : parts) {
        auto n = fatbin_bytes(bytes_of(p));
        if (!n) return std::nullopt;
        total = add(total, *n);
    }
    return total;
}

}  // namespace vcuda::server
