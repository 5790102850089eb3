// Parsing untrusted JSON with a nesting limit, and short excerpts for messages (json.h).
#include "util/json.h"

#include "util/error.h"

namespace barellm {

namespace {

using json = nlohmann::json;

// `text` cut after kExcerptBytes bytes (at a UTF-8 character boundary) with "...".
std::string shortened(std::string text) {
    if (text.size() <= kExcerptBytes) return text;
    size_t end = kExcerptBytes;
    while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    text.resize(end);
    return text + "...";
}

void append_json_string(std::string_view text, std::string& out) {
    // A cut may split a character: dump() then writes U+FFFD instead of throwing.
    out += json(std::string(text.substr(0, kExcerptBytes + 1)))
               .dump(-1, ' ', false, json::error_handler_t::replace);
}

// Appends `value` as dump() writes it, stopping soon after `out` passes kExcerptBytes bytes,
// so that a huge value is never written out whole.
void append_json(const json& value, std::string& out) {
    if (out.size() > kExcerptBytes) return;
    if (value.is_string()) {
        append_json_string(value.get_ref<const std::string&>(), out);
        return;
    }
    if (!value.is_structured()) {
        out += value.dump();
        return;
    }
    out += value.is_array() ? '[' : '{';
    for (auto item = value.begin(); item != value.end() && out.size() <= kExcerptBytes; ++item) {
        if (item != value.begin()) out += ',';
        if (value.is_object()) {
            append_json_string(item.key(), out);
            out += ':';
        }
        append_json(item.value(), out);
    }
    out += value.is_array() ? ']' : '}';
}

}  // namespace

namespace {

// parse_json and parse_ordered_json, for nlohmann's json (keys sorted) or ordered_json.
template <class Json>
Json parse_limited(std::string_view text, const std::string& what) {
    // The callback sees each array and object as it opens, at its depth (the outermost at 0).
    const auto limit_depth = [&](int depth, typename Json::parse_event_t event, Json&) {
        const bool opens =
            event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start;
        if (opens && depth >= kMaxJsonDepth)
            throw Error(what + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                        " levels");
        return true;
    };
    try {
        return Json::parse(text.begin(), text.end(), limit_depth);
    } catch (const typename Json::parse_error& e) {
        throw Error(what + ": not valid JSON (syntax error at byte " + std::to_string(e.byte) +
                    ")");
    } catch (const typename Json::out_of_range&) {  // a number beyond double's range, e.g. 2e880
        throw Error(what + ": not valid JSON (a number is out of range)");
    }
}

}  // namespace

json parse_json(std::string_view text, const std::string& what) {
    return parse_limited<json>(text, what);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& what) {
    return parse_limited<nlohmann::ordered_json>(text, what);
}

std::string json_excerpt(const json& value) {
    std::string text;
    append_json(value, text);
    return shortened(text);
}

std::string quoted_excerpt(std::string_view text) {
    std::string excerpt = shortened(std::string(text.substr(0, kExcerptBytes + 1)));
    // One line: control characters would break it.
    for (char& c : excerpt)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) c = '?';
    return "'" + excerpt + "'";
}

}  // namespace barellm
