//! The key template: `format!` syntax whose placeholders name the function's arguments
//! (`"report:{month}"`, `"user:{id}:{day:04}"`). Checked here, so that a misspelt name is an
//! error on the template naming the arguments there are, not `format!`'s "cannot find value".

/// The argument names a template's placeholders use, each once, in order of first use; or a
/// message saying what is wrong with it.
pub(crate) fn placeholders(template: &str, arguments: &[String]) -> Result<Vec<String>, String> {
    let mut used: Vec<String> = Vec::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
            }
            '}' => return Err("a lone `}` in the key template: write `}}` for a brace".into()),
            '{' => {
                let mut inside = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => inside.push(c),
                        None => {
                            return Err("a `{` without its `}` in the key template: write \
                                        `{{` for a brace"
                                .into())
                        }
                    }
                }
                let name = inside.split(':').next().unwrap_or("").trim();
                check_name(name, arguments)?;
                if !used.iter().any(|u| u == name) {
                    used.push(name.to_owned());
                }
            }
            _ => {}
        }
    }
    Ok(used)
}

fn check_name(name: &str, arguments: &[String]) -> Result<(), String> {
    let list = if arguments.is_empty() {
        "the function has no named arguments".to_owned()
    } else {
        format!("its arguments are: {}", arguments.join(", "))
    };
    if name.is_empty() || name.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!(
            "each placeholder of the key template names an argument, e.g. `{{month}}`; {list}"
        ));
    }
    if arguments.iter().any(|a| a == name) {
        return Ok(());
    }
    Err(format!(
        "the key template names `{name}`, which is not an argument of the function; {list}"
    ))
}

#[cfg(test)]
mod tests {
    use super::placeholders;

    fn args(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn names_are_found_once_each_with_specs_and_escapes() {
        let found = placeholders("r:{{x}}:{month}:{day:02}:{month}", &args(&["month", "day"]));
        assert_eq!(found.unwrap(), ["month", "day"]);
        assert_eq!(
            placeholders("static", &args(&[])).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn an_unknown_name_is_refused_with_the_arguments_listed() {
        let error = placeholders("report:{mnth}", &args(&["month", "region"])).unwrap_err();
        assert!(error.contains("`mnth`"), "{error}");
        assert!(error.contains("month, region"), "{error}");
    }

    #[test]
    fn positional_and_unbalanced_placeholders_are_refused() {
        assert!(placeholders("a:{}", &args(&["a"]))
            .unwrap_err()
            .contains("names an argument"));
        assert!(placeholders("a:{0}", &args(&["a"]))
            .unwrap_err()
            .contains("names an argument"));
        assert!(placeholders("a:{a", &args(&["a"]))
            .unwrap_err()
            .contains("without its"));
        assert!(placeholders("a:}", &args(&["a"]))
            .unwrap_err()
            .contains("lone"));
    }
}
